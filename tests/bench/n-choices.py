#!/usr/bin/env python3
# n-choices.py [N]: n > 1 in one request vs N concurrent n = 1 requests on a
# running `make run` deployment (PD_HTTP_PORT=18080, PD_RUN_DIR=/tmp/pdrun):
# wall time, KV bytes the decode pulled (admin xfer), prompt tokens the
# prefill computed (admin requests). Same 1200-token prompt length and 32
# generated tokens per choice; 3 trials, fresh prompts each (no cache hits
# across trials). docs/BENCHMARKS.md "n > 1".
import json, os, subprocess, sys, threading, time, urllib.request
PORT=os.environ.get("PD_HTTP_PORT", "18080")
RUN=os.environ.get("PD_RUN_DIR", "/tmp/pdrun")
ROOT=os.path.dirname(os.path.abspath(__file__)) + "/../.."
URL=f"http://127.0.0.1:{PORT}/v1/completions"
def adm(name, cmd):
    out=subprocess.run([ROOT+"/deploy/run-local.sh","admin",name,cmd],capture_output=True,text=True,env={**os.environ,"PD_RUN_DIR":RUN}).stdout
    return json.loads(out)
def pulled():
    x=adm("decode-0","xfer"); return x["xfer"]["total"]["bytes_pulled"]
def computed():
    x=adm("prefill-0","requests"); return x["counters"].get("computed_tokens",0)
def post(body):
    req=urllib.request.Request(URL, data=json.dumps(body).encode(), headers={"Content-Type":"application/json"})
    t=time.time(); r=json.loads(urllib.request.urlopen(req).read()); return r, time.time()-t
def run(label, fn):
    p0,c0=pulled(),computed(); t=time.time(); fn(); dt=time.time()-t
    print(f"{label}: {dt*1000:.0f} ms, KV pulled {(pulled()-p0)/1e6:.2f} MB, prefill computed {computed()-c0} tokens")
N=int(sys.argv[1]) if len(sys.argv)>1 else 4
SALT=int(time.time()) % 100003  # fresh prompts on every run: no cache hits from earlier runs
for trial in range(3):
    prompt=[4+((i*7919+trial*104729+SALT*31)%250) for i in range(1200)]
    base={"prompt":prompt,"max_tokens":32,"temperature":1.0,"ignore_eos":True}
    run(f"[{trial}] n={N} in one request", lambda: post({**base,"n":N,"seed":100}))
    prompt=[4+((i*7919+trial*104729+SALT*31+1)%250) for i in range(1200)]
    base={"prompt":prompt,"max_tokens":32,"temperature":1.0,"ignore_eos":True}
    def conc():
        th=[threading.Thread(target=post,args=({**base,"seed":100+k},)) for k in range(N)]
        [t.start() for t in th]; [t.join() for t in th]
    run(f"[{trial}] {N} concurrent n=1 requests", conc)
