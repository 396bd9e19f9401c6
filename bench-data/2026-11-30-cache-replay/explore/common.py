import time
import sys
from pathlib import Path
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TRACES = REPO / 'data' / 'route-traces'
sys.path[:0] = [str(REPO), str(HERE)]
from harness.replay.trace import load_trace
from harness.replay.simulate import replay
MIB=1024*1024
tr = {n: load_trace(TRACES / f'{n}.route.csv') for n in ('qwen', 'gptoss')}
def gap(pol, name='qwen', budgets=(2000,3000,4000)):
    out=[]
    for b in budgets:
        l=replay(tr[name],'lru',b*MIB).hit_pct; o=replay(tr[name],'belady',b*MIB).hit_pct
        t=time.time(); p=replay(tr[name],pol,b*MIB).hit_pct; dt=time.time()-t
        out.append((b,round(l,1),round(p,1),round(o,1),round(100*(p-l)/(o-l)),round(dt,1)))
    return out
if __name__=='__main__':
    for p in sys.argv[1:]:
        print(p, gap(p))
