"""Settings from the environment, overrides, and passwords that never show."""

import pytest

from shardfarm.dsn import DSN
from shardfarm.errors import ConfigError
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
    assert s.control_dsn == DSN("db.example", 3307, "u", "ctl", "p@ss")
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
