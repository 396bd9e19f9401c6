import numpy as np
import sys
from pathlib import Path
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TRACES = REPO / 'data' / 'route-traces'
sys.path[:0] = [str(REPO), str(HERE)]
rows=[l.split(',') for l in open(TRACES / 'qwen.route.csv') if not l.startswith('#') and not l.startswith('turn')]
dec=[(int(r[2]),int(r[3]),int(r[5]),float(r[6])) for r in rows if r[1]=='1']
steps=sorted(set(d[0] for d in dec)); si={s:i for i,s in enumerate(steps)}
T=len(steps); U=np.zeros((48,T,128)); Wt=np.zeros((48,T,128))
for s,L,e,w in dec: U[L,si[s],e]=1; Wt[L,si[s],e]=w
ws=[];fut=[];rate=[]
cs=np.concatenate([np.zeros((48,1,128)),np.cumsum(U,1)],1)
for L in range(48):
  for t in range(8,T-16):
    for e in np.nonzero(U[L,t])[0]:
      ws.append(Wt[L,t,e]); fut.append(U[L,t+1:t+17,e].mean()); rate.append(cs[L,t,e]/t)
ws=np.array(ws);fut=np.array(fut);rate=np.array(rate)
q=np.quantile(ws,[0,.2,.4,.6,.8,1])
for i in range(5):
  m=(ws>=q[i])&(ws<=q[i+1])
  print(f'w in [{q[i]:.2f},{q[i+1]:.2f}] fut16 {fut[m].mean():.3f} past rate {rate[m].mean():.3f}')
# residual corr after rate
A=np.stack([np.ones_like(rate),rate],1); b,*_=np.linalg.lstsq(A,fut,rcond=None); r=fut-A@b
print('corr(weight, residual fut16 | rate) =',np.corrcoef(ws,r)[0,1])
