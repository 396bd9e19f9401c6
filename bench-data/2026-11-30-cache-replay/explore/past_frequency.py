from scorepolicy import *
def pastwin(W, prior=0.0, rec=0.0):
    def f(p,L,t,batch,pre):
        U,P=USE[p.t.name]; U=U[L]
        lo=max(0,t-W); n=t-lo
        c=U[lo:t].sum(0)+prior*P[L]/max(1,p.t.prefill_tokens)
        s=c/(n+prior)
        if rec and t>0: s=s+rec*U[t-1]
        return s
    return f
def expdecay(d, prior=1.0):
    def f(p,L,t,batch,pre):
        U,P=USE[p.t.name]; U=U[L]
        w=d**np.arange(t)[::-1]
        s=(w[:,None]*U[:t]).sum(0)+prior*P[L]/max(1,p.t.prefill_tokens)*d**t
        return s
    return f
for W in (8,16,32,64,128):
    print('past window',W, run(pastwin(W,prior=4), phase=0.01))
for d in (0.9,0.95,0.98):
    print('expdecay',d, run(expdecay(d), phase=0.01))
