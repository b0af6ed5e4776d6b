# The driver of the sixty-eighth session's execute() probe: python3 <this> <scratch dir> [NAME=value ...], from the
# repository root with decoder_execute_probe_sixtyeighth.patch applied (the numbers: decoder_execute_probe_sixtyeighth.txt).
import glob, json, os, subprocess, sys, statistics
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO); sys.path.insert(0, os.path.join(REPO, "python_backend"))
from tests.server import TritonServer
from voxcpm_triton.testing.checkpoint_writer import TINY_CONFIG, write_checkpoint
tmp = sys.argv[1]; os.makedirs(tmp, exist_ok=True)
ck = os.path.join(tmp, "ckpt")
if not os.path.exists(ck + "/config.json"):
    write_checkpoint(ck, TINY_CONFIG, seed=0, progress=None)
tl = os.path.join(tmp, "tl"); os.makedirs(tl, exist_ok=True)
for f in glob.glob(tl + "/*"): os.unlink(f)
env = {"VOXCPM_CHECKPOINT": ck, "VOXCPM_TIMELINE": tl}
env.update(dict(kv.split("=", 1) for kv in sys.argv[2:]))
with TritonServer(os.path.join(REPO, "model_repository"), env=env, log_path=os.path.join(tmp, "server.log")) as srv:
    for rep in range(2):
        out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_served.py"), "--url", srv.grpc_url,
            "--concurrency", "16", "--requests-per-worker", "3", "--min-length", "6", "--max-length", "6",
            "--warmup", "0", "--quiet", "--json-out", os.path.join(tmp, "b.json")], capture_output=True, text=True)
        print(out.stdout.splitlines()[-3:] if out.returncode == 0 else out.stderr[-2000:])
import time; time.sleep(1.5)
spans = []
for f in glob.glob(tl + "/*.jsonl"):
    ev = [json.loads(l) for l in open(f)]
    if not any(e[2] == "execute" for e in ev): continue
    start = {}
    for t, th, name, val in ev:
        if name == "execute": start[th] = (t, val)
        elif name == "executed" and th in start:
            t0, n = start.pop(th); spans.append((f, (t - t0) * 1e3, n))
by = {}
for f, ms, n in spans: by.setdefault(f, []).append(ms / max(n, 1))
for f, v in by.items():
    print(os.path.basename(f), len(v), "ms/request p50 %.3f mean %.3f" % (statistics.median(v), statistics.mean(v)))
seg = {}
for f in glob.glob(tl + "/*.jsonl"):
    ev = [json.loads(l) for l in open(f)]
    last = {}
    for t, th, name, val in ev:
        if name.startswith("x"):
            if name != "x0" and th in last:
                seg.setdefault(name, []).append((t - last[th]) * 1e3)
            last[th] = t
for k, v in seg.items():
    print(k, len(v), "p50 %.3f mean %.3f" % (statistics.median(v), statistics.mean(v)))
