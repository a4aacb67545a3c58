"""The ``farm`` command as operators run it: JSON output, one-line errors, exit codes."""

import json
from pathlib import Path

import pytest

from tests.conftest import SHARDS_A, TEST_BUCKETS, run_farm


def test_id_decode_and_encode(farm_env):
    out = run_farm(farm_env, "id", "encode", "65032", "pin", "42")
    assert out.returncode == 0
    value = int(out.stdout)
    assert value == (65032 << 46) | (1 << 36) | 42
    dec = run_farm(farm_env, "id", "decode", str(value))
    assert json.loads(dec.stdout) == {"id": value, "shard": 65032, "type": 1,
                                      "type_name": "pin", "local": 42}


def test_shards_show_summarises_the_map_in_force_without_passwords(farm_env, map_path,
                                                                    tmp_path):
    doc = json.loads(Path(map_path).read_text())
    doc["hosts"]["TestA1"]["password"] = "topsecret"
    doc["mod"]["ranges"] = [{"range": [0, 9], "master": "TestA1", "slave": "TestA2"},
                            {"range": [10, TEST_BUCKETS - 1], "master": "TestB1",
                             "slave": "TestB2"}]
    path = tmp_path / "map.json"
    path.write_text(json.dumps(doc))
    out = run_farm({**farm_env, "FARM_SHARDMAP": str(path)}, "shards", "show")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert [r["range"] for r in shown["ranges"]] == [r["range"] for r in doc["shards"]]
    assert shown["mod_ranges"] == doc["mod"]["ranges"] and shown["buckets"] == TEST_BUCKETS
    assert shown["hosts"]["TestA1"] == "root@127.0.0.1:3306"
    assert "topsecret" not in out.stdout + out.stderr


@pytest.mark.slow
def test_bad_id_exits_2_with_one_line(farm_env):
    for bad in ("nope", str(2**62), "-3", str(1 << 46)):
        out = run_farm(farm_env, "id", "decode", bad)
        assert out.returncode == 2, bad
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    out = run_farm(farm_env, "id", "encode", "70000", "pin", "1")
    assert out.returncode == 2 and "shard 70000" in out.stderr


def test_modshard(farm_env):
    import hashlib
    out = run_farm(farm_env, "modshard", "1.2.3.4")
    doc = json.loads(out.stdout)
    want = int.from_bytes(hashlib.md5(b"1.2.3.4").digest(), "big") % TEST_BUCKETS
    assert doc == {"key": "1.2.3.4", "bucket": want, "master": "TestB1"}


def test_bad_shard_map_is_one_line(farm_env, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "hosts": {"A": {"host": "x"}},
                               "shards": [{"range": [0, 9], "master": "A", "slave": "B"}],
                               "mod": {"buckets": 1, "ranges": []}}))
    out = run_farm({**farm_env, "FARM_SHARDMAP": str(bad)}, "shards", "init")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "farm: error: bad shard map: shards[0].slave names unknown host 'B'")


@pytest.mark.slow
def test_unreachable_control_db_is_one_line(farm_env):
    from tests.servers import free_port
    env = {**farm_env, "FARM_CONTROL_DSN": f"mysql://root:topsecret@127.0.0.1:{free_port()}/c"}
    for command in (("shards", "init"), ("status",)):  # status retries: no line per attempt
        out = run_farm(env, *command)
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1 and "topsecret" not in out.stderr, out.stderr
        assert "cannot reach MySQL control" in out.stderr and "FARM_CONTROL_DSN" in out.stderr


def test_bad_flag_is_usage_error(farm_env):
    out = run_farm(farm_env, "shards", "init", "--no-such-flag")
    assert out.returncode == 2 and "No such option" in out.stderr
    assert out.stderr.count("\n") == 1


@pytest.mark.slow
def test_shards_init_via_cli(farm_env, router):
    out = run_farm(farm_env, "shards", "init")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["shards"] == 16 and doc["mod_buckets"] == TEST_BUCKETS and doc["servers"] == 2


def _usage_error(out, words: str) -> None:
    """Exit 2 and stderr is one ``farm: error:`` line naming the mistake (no note before
    it: with no worker running, a run's "no workers" note came first)."""
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("farm: error: ") and words in lines[0], lines[0]


@pytest.mark.slow
def test_usage_mistakes_exit_2(plain_env, router):  # plain_env: no worker registered
    farm_env = plain_env
    _usage_error(run_farm(farm_env, "cron", "--at", "bad", "--once"), "bad --at")
    _usage_error(run_farm(farm_env, "cron", "--once", "--tables", "users,nope"),
                 "cannot export nope")
    _usage_error(run_farm(farm_env, "export", "--date", "2026-02-30"), "bad export date")
    _usage_error(run_farm(farm_env, "reverse", "board_has_pins"), "not a reverse table")
    _usage_error(run_farm(farm_env, "rebalance", "pins", "--threshold", "5"),
                 "cannot rebalance 'pins'")
    _usage_error(run_farm(farm_env, "rebalance", "board_followedby_users", "--threshold", "5",
                          "--spread", "99"), "--spread 99 needs more shards")
    _usage_error(run_farm(farm_env, "migrate", "--chunk-size", "0"), "--chunk-size")
    _usage_error(run_farm(farm_env, "id", "encode", "1", "nope", "1"), "nope")


def test_usage_mistakes_are_found_before_the_shard_map_is_read(farm_env, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    env = {**farm_env, "FARM_SHARDMAP": str(broken)}
    _usage_error(run_farm(env, "export", "--date", "2026-02-30"), "bad export date")
    _usage_error(run_farm(env, "cron", "--at", "bad", "--once"), "bad --at")
    _usage_error(run_farm(env, "feeds", "rebuild", "--users", "x"), "not an integer")
    out = run_farm(env, "export", "--date", "2026-02-03")
    assert out.returncode == 1 and "broken.json" in out.stderr, out.stderr  # then the map


@pytest.mark.slow
def test_configuration_mistakes_exit_1_in_one_line(farm_env, tmp_path):
    bad_map = tmp_path / "shape.json"
    doc = {"version": 1, "hosts": {"A": {"host": "127.0.0.1"}},
           "shards": [{"range": [0, 9], "master": ["x"], "slave": "A"}],
           "mod": {"buckets": 1, "ranges": []}}
    bad_map.write_text(json.dumps(doc))
    cases = [
        ({"FARM_SHARDMAP": str(bad_map)}, ("shards", "show"),
         "bad shard map: shards[0].master must be a host name, got a list"),
        ({"FARM_REDIS_URL": "redis://:topsecret@127.0.0.1:notaport/0"}, ("status",),
         "bad FARM_REDIS_URL: redis://:***@127.0.0.1:notaport/0"),
        ({"FARM_LEGACY_DSN": "mysql://u:topsecret@h/l?sslca=/x"}, ("status",),
         "unknown parameter 'sslca'"),
        ({"FARM_CONNECT_TIMEOUT": "soon"}, ("status",), "bad FARM_CONNECT_TIMEOUT"),
    ]
    for env, args, words in cases:
        out = run_farm({**farm_env, **env}, *args)
        assert out.returncode == 1, (args, out.stderr)
        assert out.stderr.count("\n") == 1 and words in out.stderr, out.stderr
        assert "topsecret" not in out.stderr + out.stdout


def test_each_command_comes_from_the_module_named_for_it():
    """``farm`` imports a command's module when the command runs: every module registers
    exactly the commands mapped to it, and every command is mapped."""
    import importlib

    import click

    from scripts.cli import COMMANDS
    registered: dict[str, str] = {}
    for module in sorted(set(COMMANDS.values())):
        group = click.Group()
        importlib.import_module(f"scripts.{module}").register(group)
        registered.update(dict.fromkeys(group.commands, module))
    assert registered == COMMANDS


def test_a_command_loads_only_its_own_module(farm_env):
    import subprocess
    import sys
    probe = ("import sys; from scripts.cli import main\n"
             "try:\n    main(['id', 'decode', '1'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith(('scripts.cmd_', 'demo', "
             "'dashboard', 'workers.supervisor'))))")
    out = subprocess.run([sys.executable, "-c", probe], env=farm_env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['scripts.cmd_ids']"


def test_an_unknown_command_is_a_usage_error(farm_env):
    out = run_farm(farm_env, "no-such-command")
    assert out.returncode == 2 and "No such command 'no-such-command'" in out.stderr
    assert out.stderr.count("\n") == 1


def test_a_folder_named_like_a_farm_package_does_not_stand_in_for_it(farm_env, tmp_path):
    """Run where the operator keeps a ``jobs/`` package of their own: the farm's commands,
    loaded when they run, still import the farm's ``jobs``."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "__init__.py").write_text("OPERATORS = True\n")
    import subprocess
    import sys
    farm = Path(sys.executable).with_name("farm")  # the installed command (not -m, which
    out = subprocess.run([str(farm), "enqueue", "--help"], env=farm_env,  # puts "." first)
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Enqueue FUNCTION" in out.stdout, out.stderr


NO_RUN = "farm: error: no run 'nosuch-run' (see 'farm status' for the runs there are)"


@pytest.mark.parametrize("args", [("failed",), ("failed", "--json"), ("quarantine",),
                                  ("quarantine", "--json"), ("mismatches",),
                                  ("mismatches", "--json")])
def test_a_mistyped_run_is_an_error_not_an_all_clear(farm_env, ledger, args):
    out = run_farm(farm_env, *args, "--run", "nosuch-run")
    assert (out.returncode, out.stdout) == (1, ""), (out.returncode, out.stdout, out.stderr)
    assert out.stderr.splitlines() == [NO_RUN]


@pytest.fixture
def bare_runs(ledger):
    """A migrate and a verify run without chunks, deleted after the test (a bare "migrate"
    run left behind would become the latest migrate run later tests plan by)."""
    made = [ledger.create_run("migrate", "none", {}, []),
            ledger.create_run("verify", "none", {}, [])]
    yield made
    ledger.pool.run(lambda cur: cur.execute(
        "DELETE FROM runs WHERE run_id IN (%s, %s)", made))


def test_a_known_run_without_findings_is_still_all_clear(farm_env, bare_runs):
    migrate, verify = bare_runs
    for args, line in [(("failed", "--run", migrate), "no failures"),
                       (("quarantine", "--run", migrate), f"0 quarantined in {migrate}: "),
                       (("mismatches", "--run", verify), f"no mismatches in {verify}")]:
        out = run_farm(farm_env, *args)
        assert out.returncode == 0 and out.stdout.splitlines() == [line], out.stderr


def test_a_run_of_another_kind_is_an_error_not_an_all_clear(farm_env, bare_runs):
    """Before, 'farm mismatches --run <a migrate run>' printed 'no mismatches in …' and
    'farm quarantine --run <a verify run>' '0 quarantined in …', exit 0: a migration that
    was never verified looked verified clean."""
    migrate, verify = bare_runs
    for args, line in [(("mismatches", "--run", migrate),
                        f"{migrate} is a migrate run, not a verify run"),
                       (("quarantine", "--run", verify),
                        f"{verify} is a verify run, not a migrate run")]:
        out = run_farm(farm_env, *args)
        assert (out.returncode, out.stdout) == (1, ""), out
        assert out.stderr.splitlines() == [f"farm: error: {line}"]


@pytest.mark.parametrize("limit", ["0", "-5"])
def test_a_quarantine_limit_below_one_is_a_usage_error(farm_env, ledger, limit):
    """Before, --limit -5 reached MySQL as 'LIMIT -5': a SQL syntax error, exit 1; and
    --limit 0 listed every row."""
    out = run_farm(farm_env, "quarantine", "--limit", limit)
    assert (out.returncode, out.stdout) == (2, ""), out
    assert out.stderr.splitlines() == [
        f"farm: error: Invalid value for '--limit': {limit} is not in the range x>=1. "
        "(see 'farm quarantine --help')"]


@pytest.mark.parametrize("url,why", [
    ("ftp://x", "expected s3://bucket/prefix or file:///abs/dir"),
    ("file://relative/dir", "file:// needs an absolute path: file:///abs/dir"),
    ("s3:///no-bucket", "expected s3://bucket/prefix or file:///abs/dir"),
    ("ftp://me:topsecret@x/y", "expected s3://bucket/prefix or file:///abs/dir"),
    ("s3://me:topsecret@bkt/y", "an S3 bucket name is letters, digits, '.', '-' and '_' "
                                "(no user or password)"),
    ("s3://my bucket!/y", "an S3 bucket name is letters, digits, '.', '-' and '_' "
                          "(no user or password)"),
])
def test_a_bad_destination_is_usage_as_a_flag_and_config_in_the_environment(farm_env, url,
                                                                            why):
    shown = url.replace("topsecret", "***")
    cases = [
        (farm_env, ("export", "--date", "2026-11-20", "--dest", url), 2, "--dest"),
        (farm_env, ("cron", "--once", "--dest", url), 2, "--dest"),
        (farm_env, ("export", "--date", "2026-11-20", "--export-url", url), 2, "--export-url"),
        ({**farm_env, "FARM_EXPORT_URL": url}, ("export", "--date", "2026-11-20"), 1,
         "FARM_EXPORT_URL"),
    ]
    for env, args, code, name in cases:
        out = run_farm(env, *args)
        assert out.returncode == code, (args, out.returncode, out.stderr)
        assert out.stderr.splitlines() == [f"farm: error: bad {name}: {shown} ({why})"]
        assert "topsecret" not in out.stdout + out.stderr


def test_a_bad_connection_flag_is_usage_and_the_same_variable_config(farm_env):
    dsn = "mysql://u:topsecret@h/"
    flag = run_farm(farm_env, "status", "--control-dsn", dsn)
    env = run_farm({**farm_env, "FARM_CONTROL_DSN": dsn}, "status")
    why = "mysql://u:***@h/ (database name missing or invalid)"
    assert (flag.returncode, flag.stderr) == (2, f"farm: error: bad --control-dsn: {why}\n")
    assert (env.returncode, env.stderr) == (1, f"farm: error: bad FARM_CONTROL_DSN: {why}\n")
    out = run_farm(farm_env, "status", "--redis-url", "http://h")
    assert out.returncode == 2 and out.stderr.startswith("farm: error: bad --redis-url: ")


@pytest.mark.parametrize("args,flag,value", [
    (("export", "--date", "2026-11-20"), "--tables", ""),
    (("export", "--date", "2026-11-20"), "--tables", ","),
    (("export", "--date", "2026-11-20"), "--tables", " , "),
    (("cron", "--once"), "--tables", ","),
    (("workers", "--burst", "--count", "1"), "--queues", ""),
    (("workers", "--burst", "--count", "1"), "--queues", ","),
    (("feeds", "rebuild"), "--users", ""),
    (("workers", "--burst", "--count", "0"), "--allow-module", ""),
])
def test_an_empty_list_is_refused_not_taken_for_everything(farm_env, args, flag, value):
    out = run_farm(farm_env, *args, flag, value, timeout=60)
    assert (out.returncode, out.stdout) == (2, ""), (out.returncode, out.stdout, out.stderr)
    assert out.stderr.splitlines() == [
        f"farm: error: bad {flag} {value!r}: the list is empty (leave {flag} out for the "
        "default)"]


def test_an_empty_item_in_a_list_is_refused(farm_env):
    for args in (("export", "--date", "2026-11-20", "--tables", "users,,pins"),
                 ("workers", "--burst", "--queues", "farm,")):
        out = run_farm(farm_env, *args, timeout=60)
        assert out.returncode == 2 and out.stderr.splitlines() == [
            f"farm: error: bad {args[-2]} {args[-1]!r}: an empty item between commas"]


@pytest.mark.parametrize("args", [
    ("shards", "move", "0-1", "--to", "TestB1/TestB2", "--drop-source", "--yes", "--grace", "nan"),
    ("shards", "move", "0-1", "--to", "TestB1/TestB2", "--drop-source", "--yes", "--grace", "inf"),
    ("shards", "promote", "TestA2", "--wait-seconds", "nan"),
    ("cutover", "--timeout", "nan"),
    ("cutover", "--timeout", "inf"),
    ("reverse", "--max-lag", "nan"),
    ("migrate", "--max-lag", "inf"),
    ("rebalance", "board_followedby_users", "--threshold", "5", "--max-lag", "1e400"),
])
def test_seconds_that_are_not_a_finite_number_are_usage_errors(farm_env, args):
    """``nan`` passed every range check (a grace skipped, a wait never ending) and ``inf``
    broke ``time.sleep`` (a traceback after the map was flipped) or the run's JSON
    parameters: each is now refused before anything starts."""
    out = run_farm({**farm_env, "FARM_CONTROL_DSN": "mysql://root@127.0.0.1:1/nowhere"}, *args,
                   timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("farm: error: Invalid value for '--"), lines


def test_followers_of_an_id_that_is_not_a_board_is_a_usage_error(farm_env, router):
    """``farm followers`` of a pin's or user's ID printed an empty page (exit 0), as if a
    board had no followers; it is refused like any ID of the wrong kind."""
    pin = str((SHARDS_A[0] << 46) | (1 << 36) | 5)
    out = run_farm(farm_env, "followers", pin)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert out.stderr.splitlines() == [f"farm: error: {pin} is not a board ID (it is a pin)"]


def test_a_flag_of_farm_sync_given_to_its_status_is_a_usage_error(farm_env):
    """``farm sync --until-caught-up status`` used to print the status and drop the flag."""
    _usage_error(run_farm(farm_env, "sync", "--until-caught-up", "status", timeout=60),
                 "--until-caught-up goes with 'farm sync' itself")


@pytest.mark.parametrize("args,what,value", [
    (("enqueue", "", "tests.kinds.record", "--file", "-"), "QUEUE", ""),
    (("enqueue", "a b", "tests.kinds.record", "--file", "-"), "QUEUE", "a b"),
    (("enqueue", "a,b", "tests.kinds.record", "--file", "-"), "QUEUE", "a,b"),
    (("workers", "--burst", "--count", "1", "--queues", "farm,fe eds"), "--queues", "fe eds"),
])
def test_a_queue_no_worker_could_serve_is_a_usage_error(farm_env, args, what, value):
    """Before, 'farm enqueue "" …' (an unset $QUEUE) or 'farm enqueue "a b" …' queued the
    items on a queue 'farm workers --queues' cannot name (it refuses '' and splits at
    commas): they waited for ever; a worker was started on 'fe eds'."""
    out = run_farm(farm_env, *args, input='{"key": "q", "value": 1}\n', timeout=60)
    assert (out.returncode, out.stdout) == (2, ""), out
    assert out.stderr.splitlines() == [
        f"farm: error: bad {what} {value!r}: a queue name is one word without spaces or "
        "commas, e.g. farm"]


def test_every_option_of_every_command_says_what_it_is():
    """'farm followers --help' showed '--limit INTEGER RANGE  [default: 50; …]' and nothing
    saying what it limits."""
    import click

    from scripts.cli import cli
    ctx = click.Context(cli)
    bare = []

    def walk(cmd: click.Command, path: str) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), f"{path} {name}")
        bare.extend(f"{path} {p.opts[0]}" for p in cmd.params
                    if isinstance(p, click.Option) and not p.hidden and not p.help)
    walk(cli, "farm")
    assert bare == []
