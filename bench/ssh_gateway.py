"""SSH gateway throughput: `scp` of one file (default 200 MB) up and down through Corral's gateway
into a running job's sandbox, against OpenSSH's own sshd on the same machine in the same run
(and a plain `cp`, the disk's own ceiling).

    .venv/bin/python -m bench.ssh_gateway             # 200 MB, 2 rounds
    .venv/bin/python -m bench.ssh_gateway --mb 50 --rounds 1

Both sides use the same client (Debian's OpenSSH scp, SFTP protocol), the same key type
(ed25519) and cipher negotiation defaults; the gateway's file side is OpenSSH's sftp-server run
inside the job's sandbox, so the difference is the gateway itself (asyncssh in the server
process, plus the pipes into the sandbox). sshd is skipped (and said so) when /usr/sbin/sshd is
missing (`scripts/setup.sh test` installs openssh-server). Prints MB/s per direction and the
gateway/sshd ratio; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.server_harness import free_port, start_server  # noqa: E402

SSHD = "/usr/sbin/sshd"
OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes"]
OPTS += ["-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes"]


def timed_scp(port: int, key: Path, src: str, dst: str) -> float:
    start = time.perf_counter()
    subprocess.run(["scp", "-q", "-P", str(port), "-i", str(key), *OPTS, src, dst], check=True, timeout=600)
    return time.perf_counter() - start


def start_job(server_url: str, token: str, key: Path) -> int:
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        pub = key.with_suffix(".pub").read_text()
        r = c.post("/api/v1/ssh-keys", json={"name": "bench", "public_key": pub})
        r.raise_for_status()
        spec = {"name": "sink", "tasks": {"main": {"command": "echo ready; exec sleep 3600"}}}
        r = c.post("/api/v1/jobs", json=spec)
        r.raise_for_status()
        job_id = int(r.json()["id"])
        deadline = time.monotonic() + 60
        while "ready" not in c.get(f"/api/v1/jobs/{job_id}/logs").json()["data"]:
            if time.monotonic() > deadline:
                raise SystemExit("the job did not start")
            time.sleep(0.2)
        return job_id


def start_sshd(tmp: Path, key: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    if not os.access(SSHD, os.X_OK):
        return None
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    host_key = tmp / "sshd_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    authorized = tmp / "authorized_keys"
    authorized.write_text(key.with_suffix(".pub").read_text())
    port = free_port()
    config = tmp / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nAuthorizedKeysFile {authorized}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nStrictModes no\nUsePAM no\n"
        "Subsystem sftp internal-sftp\nPidFile none\n"
    )
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-ssh-"))
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    payload = tmp / "payload.bin"
    with open(payload, "wb") as f:
        for _ in range(args.mb):
            f.write(os.urandom(1 << 20))
    size_mb = args.mb * (1 << 20) / 1e6
    gateway_port = free_port()
    server = start_server(tmp / "home", extra_env={"CORRAL_SSH_GATEWAY_PORT": str(gateway_port)})
    sshd = None
    results: dict[str, float] = {}
    try:
        job_id = start_job(server.url, server.token, key)
        gw = f"admin+job-{job_id}@127.0.0.1"
        sshd = start_sshd(tmp, key)

        def best(port: int, up_dst: str, down_src: str, name: str) -> None:
            ups = [timed_scp(port, key, str(payload), up_dst) for _ in range(args.rounds)]
            back = str(tmp / f"back-{name}.bin")
            downs = [timed_scp(port, key, down_src, back) for _ in range(args.rounds)]
            results[f"{name}_up_mb_s"] = size_mb / min(ups)
            results[f"{name}_down_mb_s"] = size_mb / min(downs)

        best(gateway_port, f"{gw}:/tmp/payload.bin", f"{gw}:/tmp/payload.bin", "gateway")
        if (tmp / "back-gateway.bin").read_bytes() != payload.read_bytes():
            raise SystemExit("the file that came back through the gateway differs")
        if sshd is not None:
            target = str(tmp / "sshd-copy.bin")
            best(sshd[1], f"root@127.0.0.1:{target}", f"root@127.0.0.1:{target}", "sshd")
        starts = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            shutil.copyfile(payload, tmp / "cp-copy.bin")
            os.sync()
            starts.append(time.perf_counter() - start)
        results["cp_mb_s"] = size_mb / min(starts)
    finally:
        if sshd is not None:
            sshd[0].terminate()
            sshd[0].wait(timeout=10)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"scp of {size_mb:.0f} MB, best of {args.rounds} (MB/s):")
    for direction in ("up", "down"):
        line = f"  {direction:4}  gateway {results[f'gateway_{direction}_mb_s']:7.1f}"
        if f"sshd_{direction}_mb_s" in results:
            ratio = results[f"gateway_{direction}_mb_s"] / results[f"sshd_{direction}_mb_s"]
            results[f"ratio_{direction}"] = ratio
            line += f"   sshd {results[f'sshd_{direction}_mb_s']:7.1f}   gateway/sshd {ratio:.2f}x"
        print(line)
    if sshd is None:
        print(f"  (no {SSHD}: compared with plain cp only)")
    print(f"  cp    {results['cp_mb_s']:7.1f}  (the disk's own ceiling)")
    print(json.dumps({k: round(v, 2) for k, v in results.items()}))


if __name__ == "__main__":
    main()
