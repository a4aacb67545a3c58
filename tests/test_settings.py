"""Settings from the environment, overrides, and passwords that never show."""

import pytest

from shardfarm.errors import ConfigError
from shardfarm.mysql.dsn import DSN
from shardfarm.settings import Settings


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({})
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert (s.control_dsn.host, s.control_dsn.port, s.control_dsn.database) == (
        "127.0.0.1", 3306, "farm_control")
    assert s.legacy_dsn.database == "legacy"
    assert s.shardmap_path is None
    assert s.export_url == f"file://{tmp_path}/exports"


def test_env_and_override():
    env = {"FARM_CONTROL_DSN": "mysql://u:p%40ss@db.example:3307/ctl",
           "FARM_EXPORT_URL": "s3://bucket/prefix"}
    s = Settings.from_env(env, FARM_EXPORT_URL="file:///tmp/x")
    assert s.control_dsn == DSN(name="control", host="db.example", port=3307, user="u",
                                database="ctl", password="p@ss")
    assert s.export_url == "file:///tmp/x"


def test_password_never_printed():
    s = Settings.from_env({"FARM_LEGACY_DSN": "mysql://u:hunter2@h/legacy",
                           "FARM_REDIS_URL": "redis://:hunter2@h:6379/0"})
    assert "hunter2" not in str(s.legacy_dsn) + repr(s.legacy_dsn) + repr(s.describe()) + repr(s)


@pytest.mark.parametrize("env", [
    {"FARM_CONTROL_DSN": "postgres://u@h/db"},
    {"FARM_CONTROL_DSN": "mysql://u:hunter2@h/"},
    {"FARM_LEGACY_DSN": "mysql://h/db"},
    {"FARM_REDIS_URL": "http://h"},
    {"FARM_EXPORT_URL": "file://relative/dir"},
    {"FARM_EXPORT_URL": "ftp://x"},
    {"FARM_CONTROL_DSN": "mysql://u@h:notaport/db"},
])
def test_bad_config_is_one_line_without_password(env):
    with pytest.raises(ConfigError) as exc:
        Settings.from_env(env)
    assert "\n" not in str(exc.value) and "hunter2" not in str(exc.value)


@pytest.mark.parametrize("url,why", [
    ("redis://127.0.0.1:notaport/0", "notaport"),
    ("redis://:hunter2@127.0.0.1:99999/0", "out of range"),
    ("redis://:hunter2@127.0.0.1:6379/zero", "must be a number"),
    ("redis://:hunter2@127.0.0.1:6379/0?db=x", "db"),
    ("redis://:hunter2@127.0.0.1:6379/0?no_such_option=1", "no_such_option"),
    ("rediss://:hunter2@127.0.0.1:6379/0?ssl_cert_reqs=maybe", "maybe"),
    ("redis://:hunter2@[::1/0", "IPv6"),
    ("redis://:hunter2@127.0.0.1:0/0", "port 0"),
])
def test_malformed_redis_url_is_refused_in_one_line(url, why):
    """Checked with redis-py's own URL parser, at settings time, not at first use."""
    with pytest.raises(ConfigError) as exc:
        Settings.from_env({"FARM_REDIS_URL": url})
    msg = str(exc.value)
    assert msg.startswith("bad FARM_REDIS_URL: ") and why in msg
    assert "\n" not in msg and "hunter2" not in msg


@pytest.mark.parametrize("url", [
    "redis://:hunter2@127.0.0.1:6379/3",
    "redis://farm:hunter2@redis.example:6380/0",
    "rediss://:hunter2@redis.example:6380/0?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required",
    "unix:///run/redis.sock?db=2",
])
def test_good_redis_urls_pass_and_hide_the_password(url):
    s = Settings.from_env({"FARM_REDIS_URL": url})
    assert s.redis_url == url
    assert "hunter2" not in repr(s) + repr(s.describe())


def test_connect_timeout_setting(monkeypatch):
    from shardfarm.tuning import connect_timeout
    assert Settings.from_env({}).connect_timeout == 10
    assert Settings.from_env({"FARM_CONNECT_TIMEOUT": "2.5"}).connect_timeout == 2.5
    monkeypatch.setenv("FARM_CONNECT_TIMEOUT", "4")
    assert connect_timeout() == 4
    for bad in ("abc", "0", "-1", "nan", "inf", "99999"):
        with pytest.raises(ConfigError, match="FARM_CONNECT_TIMEOUT"):
            Settings.from_env({"FARM_CONNECT_TIMEOUT": bad})


def test_dsns_carry_tls_parameters():
    s = Settings.from_env({"FARM_CONTROL_DSN": "mysql://u:hunter2@h/c?ssl_ca=/ca.pem",
                           "FARM_LEGACY_DSN": "mysql://u:hunter2@h/l?ssl_ca=/ca.pem"})
    assert s.control_dsn.tls_args()["ssl_ca"] == s.legacy_dsn.tls_args()["ssl_ca"] == "/ca.pem"
