"""Redis with a password, plain and over TLS (``rediss://``), end to end through the real
``farm`` command and its workers; the password never appears in any output or log.

Each test starts a private ``redis-server`` on a free port (``--requirepass``; for TLS
``--tls-port`` with a self-signed certificate made here by ``openssl``) and stops it after.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import run_farm
from tests.servers import free_port

pytestmark = pytest.mark.slow  # end-to-end: real workers, servers or long waits

PASSWORD = "Redis-Pw-7f3a9c"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
JOB_MODULE = '''
from pathlib import Path


def touch(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (the proof that a worker ran the item)."""
    Path(path).write_text(text)
'''


def _self_signed(where: Path) -> tuple[Path, Path]:
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture(params=["redis", "rediss"])
def private_redis(request, tmp_path):
    """``(url, wrong_url)`` of a private password-protected Redis, plain or TLS."""
    port = free_port()
    args = [REDIS_SERVER, "--bind", "127.0.0.1", "--requirepass", PASSWORD, "--save", "",
            "--appendonly", "no", "--dir", str(tmp_path)]
    query, kwargs = "", {}
    if request.param == "rediss":
        cert, key = _self_signed(tmp_path)
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                 "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                 "--tls-auth-clients", "no"]
        query, kwargs = f"?ssl_ca_certs={cert}", {"ssl": True, "ssl_ca_certs": str(cert)}
    else:
        args += ["--port", str(port)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, **kwargs)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"private redis-server ({request.param}) did not start")
            time.sleep(0.05)
    scheme = request.param
    yield (f"{scheme}://:{PASSWORD}@127.0.0.1:{port}/0{query}",
           f"{scheme}://:not-{PASSWORD}@127.0.0.1:{port}/0{query}")
    client.close()
    proc.terminate()
    proc.wait(timeout=10)


def test_enqueue_and_work_with_a_password_protected_redis(private_redis, farm_env, ledger,
                                                          tmp_path):
    url, wrong = private_redis
    (tmp_path / "farm_auth_jobs.py").write_text(JOB_MODULE)
    env = {**farm_env, "FARM_REDIS_URL": url, "FARM_LOG_LEVEL": "DEBUG",
           "FARM_JOB_MODULES": "farm_auth_jobs",
           "PYTHONPATH": f"{tmp_path}:{farm_env['PYTHONPATH']}"}
    proof = tmp_path / "ran.txt"
    outputs = []
    out = run_farm(env, "enqueue", "authq", "farm_auth_jobs.touch", "--file", "-",
                   input=f'{{"path": "{proof}", "text": "ok"}}\n')
    outputs.append(out)
    assert out.returncode == 0, out.stderr
    assert '"enqueued": 1' in out.stdout
    out = run_farm(env, "workers", "--count", "1", "--burst", "--queues", "authq", timeout=120)
    outputs.append(out)
    assert out.returncode == 0, out.stderr
    assert proof.read_text() == "ok"
    outputs.append(run_farm(env, "status"))
    assert outputs[-1].returncode == 0, outputs[-1].stderr
    bad = run_farm({**env, "FARM_REDIS_URL": wrong}, "status")
    outputs.append(bad)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "FARM_REDIS_URL" in bad.stderr.strip().splitlines()[-1]
    for o in outputs:
        assert PASSWORD not in o.stdout + o.stderr
