from scorepolicy import *
def feats(name):
    U,P=USE[name]; nL,T,E=U.shape
    pre=P/ max(1,tr[name].prefill_tokens)
    F={}
    cs=np.concatenate([np.zeros((nL,1,E)),np.cumsum(U,1)],1)  # cs[:,t]=sum U[:t]
    rows=[]
    for t in range(T+1):
        f=[np.ones((nL,E))]
        for w in (1,2,4,8,16,32,128):
            lo=max(0,t-w); n=t-lo
            f.append((cs[:,t]-cs[:,lo])/max(1,n) if n>0 else pre)
        f.append(pre)
        f.append((cs[:,t]+pre*4)/(t+4))
        rows.append(np.stack(f,-1))
    X=np.stack(rows,1)  # nL, T+1, E, nf
    return X
def target(name,W):
    U,P=USE[name]; nL,T,E=U.shape
    cs=np.concatenate([np.zeros((nL,1,E)),np.cumsum(U,1)],1)
    Y=np.stack([(cs[:,min(T,t+W)]-cs[:,t])/max(1,min(T,t+W)-t) if t<T else np.zeros((nL,E)) for t in range(T+1)],1)
    return Y
def fitted(name,W):
    X=feats(name); Y=target(name,W)
    A=X[:,:-1].reshape(-1,X.shape[-1]); y=Y[:,:-1].reshape(-1)
    beta,*_=np.linalg.lstsq(A,y,rcond=None)
    S=(X@beta)
    def f(p,L,t,batch,pre): return S[L,t]
    return f,beta
for W in (8,16,32):
    f,beta=fitted('qwen',W)
    print('in-sample linear fit future',W, run(f, phase=0.01), np.round(beta,2))
