#!/usr/bin/env bash
# The OpenAI Files API's throughput against S3 directly, on one S3 server, in one run:
#   - upload:   curl -F file=@FILE to /v1/files (the server streams it into an S3 multipart upload)
#               vs the minio client's fPutObject of the same file to the same S3 server;
#   - download: curl of /v1/files/ID/content (the server streams the object back)
#               vs the minio client's getObject;
# the sides interleaved, ROUNDS rounds; and the server's peak memory (VmHWM) over the whole run.
#   bench/openai_files_bench.sh [BUILD_DIR] [MEGABYTES] [ROUNDS]     (default: build 500 3)
# Needs node (tests/js installed) and curl. Runs an s3rver and a `minions server` of its own on
# loopback; everything lives under a temporary folder, removed at the end.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$here/build}" && pwd)"
mb="${2:-500}"
rounds="${3:-3}"
minions="$build/apps/minions"
work="$(mktemp -d /tmp/minions-openai-bench.XXXXXX)"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  "$here/tests/services/s3rver.sh" stop "$work/s3" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$here/tests/services/s3rver.sh" start "$work/s3" 0 >/dev/null
endpoint="$(cat "$work/s3/endpoint")"
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_ENDPOINT_URL="$endpoint" AWS_REGION=us-east-1

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc="127.0.0.1:$(port)"
http="127.0.0.1:$(port)"
"$minions" server --listen "$grpc" --http-listen "$http" --data-dir "$work/server" \
  --objects "s3://minions-test/bench" --openai-max-file-bytes $(( (mb + 16) << 20 )) 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 100); do [ -s "$work/server/admin-token" ] && curl -sf "http://$http/healthz" >/dev/null && break; sleep 0.2; done
export MINIONS_TOKEN_FILE="$work/server/admin-token"
"$minions" admin team create bench --server "$grpc" >/dev/null
"$minions" admin token issue --role submitter --team bench --name bench -o "$work/key" --server "$grpc" >/dev/null
key="$(cat "$work/key")"

# A JSONL file of MB megabytes (the content does not matter to either side).
python3 - "$work/input.jsonl" "$mb" <<'PY'
import json, sys
line = (json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "m", "messages": [{"role": "user", "content": "y" * 900}]}}) + "\n").encode()
with open(sys.argv[1], "wb") as f:
    left = int(sys.argv[2]) << 20
    while left > 0:
        f.write(line[:left]); left -= len(line)
PY
bytes=$(stat -c %s "$work/input.jsonl")
rss_start=$(awk '/VmRSS/ {print $2}' /proc/$server_pid/status)

now_ms() { date +%s%3N; }
up_api=0; down_api=0; up_s3=0; down_s3=0
for round in $(seq "$rounds"); do
  s3=$(node "$here/tests/js/minio_copy.mjs" "$endpoint" minions-test "direct/round-$round" "$work/input.jsonl")
  up_s3=$(python3 -c "import json,sys; print($up_s3 + json.loads(sys.argv[1])['put_ms'])" "$s3")
  down_s3=$(python3 -c "import json,sys; print($down_s3 + json.loads(sys.argv[1])['get_ms'])" "$s3")
  t0=$(now_ms)
  id=$(curl -sS -f -H "Authorization: Bearer $key" -F purpose=batch -F "file=@$work/input.jsonl" \
    "http://$http/v1/files" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  t1=$(now_ms)
  got=$(curl -sS -f -H "Authorization: Bearer $key" -o /dev/null -w '%{size_download}' "http://$http/v1/files/$id/content")
  t2=$(now_ms)
  [ "$got" = "$bytes" ] || { echo "downloaded $got bytes of $bytes" >&2; exit 1; }
  curl -sS -f -X DELETE -H "Authorization: Bearer $key" "http://$http/v1/files/$id" >/dev/null
  up_api=$((up_api + t1 - t0)); down_api=$((down_api + t2 - t1))
done
peak=$(awk '/VmHWM/ {print $2}' /proc/$server_pid/status)
python3 - "$bytes" "$rounds" "$up_api" "$down_api" "$up_s3" "$down_s3" "$rss_start" "$peak" <<'PY'
import sys
b, r, ua, da, us, ds, rss, peak = sys.argv[1:]
b = int(b); r = int(r)
mbps = lambda ms: b * r / (1 << 20) / (max(float(ms), 1.0) / 1000)  # a tiny file may take under 1 ms
print(f"file: {b / (1 << 20):.0f} MiB, {r} rounds, interleaved")
print(f"{'':10} {'/v1/files':>12} {'minio->S3':>12} {'ratio':>8}")
print(f"{'upload':10} {mbps(ua):9.1f} MB/s {mbps(us):9.1f} MB/s {mbps(ua) / mbps(us):7.0%}")
print(f"{'download':10} {mbps(da):9.1f} MB/s {mbps(ds):9.1f} MB/s {mbps(da) / mbps(ds):7.0%}")
print(f"server memory: {int(rss) / 1024:.0f} MiB before, peak {int(peak) / 1024:.0f} MiB over the run")
PY
