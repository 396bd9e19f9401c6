from scorepolicy import *
import md_told_rate as o5
# history-matching estimate of the next-H usage of layer L experts
def knn_q(name, H=16, k=4, gamma=8.0, mix=0.5):
    U,P=USE[name]; nL,T,E=U.shape
    S=U.transpose(1,0,2).reshape(T,-1).astype(float)  # token signatures
    cs=np.cumsum(S,0)
    def ctx(t):  # mean signature of tokens [t-k, t)
        lo=max(0,t-k); return (cs[t-1]-(cs[lo-1] if lo>0 else 0))/(t-lo)
    cache={}
    def q_at(L,t):
        # tokens fully known: < t-1 (conservative)
        tt=t-1
        if tt< k+H+2: return None
        if tt not in cache:
            c=ctx(tt); cn=c/np.linalg.norm(c)
            ss=np.arange(k, tt-H)
            C=np.stack([ctx(s) for s in ss]); C/=np.linalg.norm(C,axis=1,keepdims=True)
            sim=np.clip(C@cn,0,1)**gamma
            cache[tt]=(ss,sim/sim.sum())
        ss,w=cache[tt]
        fut=np.stack([U[L,s:s+H].mean(0) for s in ss])
        return w@fut
    return q_at
def md_knn(name,mix=0.5,**kw):
    qa=knn_q(name,**kw)
    base=o5.md()
    def f(p,L,t,batch,pre):
        U,P=USE[p.t.name]; nL,T,E=U.shape
        npre=p.t.prefill_tokens
        occ=P[L]+U[L,:t].sum(0); tok=npre+t
        q0=(occ+0.5)/(tok+0.5*E/6)
        qk=qa(L,t)
        s=base(p,L,t,batch,pre)
        if qk is not None:
            qm=(1-mix)*q0+mix*(qk+0.5/ (16+0.5*E/6))
            s=s+np.log2(qm)-np.log2(q0)
        return s
    return f
for mix in (0.3,0.6):
  for g in (4,16):
    print('md+knn mix',mix,'gamma',g, run(md_knn('qwen',mix=mix,gamma=g), phase=1.0))
