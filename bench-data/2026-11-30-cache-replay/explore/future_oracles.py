from scorepolicy import *
def next_use(p,L,t,batch,pre):
    U=USE[p.t.name][0][L]; T=U.shape[0]
    s=np.full(U.shape[1], -1e6)
    fut=U[t:]
    if fut.shape[0]==0: return s
    any_=fut.any(0); first=fut.argmax(0)
    s[any_]=-first[any_]
    return s
def win(W):
    def f(p,L,t,batch,pre):
        U=USE[p.t.name][0][L]; return U[t:t+W].mean(0) if t<U.shape[0] else np.zeros(U.shape[1])
    return f
print('oracle next-use', run(next_use))
for W in (4,8,16,32,128):
    print('oracle future window',W, run(win(W), phase=0.01))
