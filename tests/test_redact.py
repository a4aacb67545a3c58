"""Passwords holding / # ? @ : never show: not in redacted URLs, not in URL parse errors
(urlsplit's own messages quote a piece of the password as "the port"), not in logs."""

from __future__ import annotations

import json
import logging

import pytest

from shardfarm import log as farm_log
from shardfarm.errors import ConfigError
from shardfarm.mysql.dsn import DSN
from shardfarm.redact import redact, redact_url
from shardfarm.settings import Settings
from tests.conftest import run_farm

# each password's two halves are checked for separately: a leak of either half shows
PASSWORDS = ["Zq1/Xw2", "Zq1#Xw2", "Zq1?Xw2", "Zq1@Xw2", "Zq1:Xw2", "Zq1@Xw2@", "Zq1/@:#?Xw2"]
UNPARSABLE = [p for p in PASSWORDS if set(p) & set("/#?")]


def _hidden(text: str) -> None:
    assert "Zq1" not in text and "Xw2" not in text, text


@pytest.mark.parametrize("password", PASSWORDS)
def test_redaction_hides_up_to_the_last_at(password):
    for url, want in [(f"mysql://u:{password}@h:3306/db", "mysql://u:***@h:3306/db"),
                      (f"redis://:{password}@h:6379/0", "redis://:***@h:6379/0")]:
        assert redact(url) == redact_url(url) == want
        line = redact(f"lost {url} twice; mail ops@example.com, see mysql://root@h/x")
        assert line == f"lost {want} twice; mail ops@example.com, see mysql://root@h/x"


def test_redaction_of_the_reported_case_and_query_passwords():
    assert redact("redis://:p@ss@host") == "redis://:***@host"
    assert redact_url("mysql://u:pa ss@h/db") == "mysql://u:***@h/db"  # one URL: any char
    assert redact("unix:///run/r.sock?db=2&password=Zq1Xw2") == \
        "unix:///run/r.sock?db=2&password=***"
    for clean in ("redis://127.0.0.1:6379/0", "mysql://root@h:3306/db", "file:///a/b:c"):
        assert redact(clean) == redact_url(clean) == clean


@pytest.mark.parametrize("password", UNPARSABLE)
def test_a_dsn_whose_password_breaks_parsing_says_so_without_quoting_it(password):
    for what in ("FARM_CONTROL_DSN", "FARM_LEGACY_DSN"):
        with pytest.raises(ConfigError) as exc:
            Settings.from_env({what: f"mysql://root:{password}@127.0.0.1:3306/x"})
        msg = str(exc.value)
        _hidden(msg)
        assert msg.startswith(f"bad {what}: mysql://root:***@127.0.0.1:3306/x (")
        assert "percent-encoded" in msg and "\n" not in msg


@pytest.mark.parametrize("password", UNPARSABLE)
def test_a_redis_url_whose_password_breaks_parsing_says_so_without_quoting_it(password):
    with pytest.raises(ConfigError) as exc:
        Settings.from_env({"FARM_REDIS_URL": f"redis://:{password}@127.0.0.1:6379/0"})
    msg = str(exc.value)
    _hidden(msg)
    assert msg.startswith("bad FARM_REDIS_URL: redis://:***@127.0.0.1:6379/0 (")
    assert "percent-encoded" in msg


def test_other_url_errors_are_fixed_words():
    cases = [("mysql://u:Zq1Xw2@h:99999/db", "port out of range"),
             ("mysql://u:Zq1Xw2@[::1/db", "IPv6"),
             ("mysql://u:Zq1Xw2@h:notaport/db", "the port is not a number")]
    for url, why in cases:
        with pytest.raises(ConfigError) as exc:
            DSN.parse(url, what="FARM_LEGACY_DSN")
        _hidden(str(exc.value))
        assert why in str(exc.value)


@pytest.mark.parametrize("password", ["Zq1@Xw2", "Zq1:Xw2", "Zq1/@:#?Xw2"])
def test_passwords_parse_as_given_or_percent_encoded(password):
    from urllib.parse import quote
    if not set(password) & set("/#?"):  # @ and : need no encoding
        dsn = DSN.parse(f"mysql://u:{password}@h:3306/db")
        assert (dsn.password, dsn.host, dsn.port) == (password, "h", 3306)
    dsn = DSN.parse(f"mysql://u:{quote(password, safe='')}@h:3306/db")
    assert dsn.password == password and DSN.parse(dsn.url()) == dsn
    _hidden(str(dsn) + repr(dsn))
    s = Settings.from_env({"FARM_REDIS_URL": f"redis://:{quote(password, safe='')}@h:6379/0"})
    _hidden(repr(s.describe()))


def test_log_lines_hide_passwords_holding_at_and_slash():
    rec = logging.LogRecord("farm.test", logging.INFO, __file__, 1,
                            "lost redis://:Zq1@Xw2@r:6379/0 and mysql://u:Zq1/Xw2@h/db", (),
                            None)
    _hidden(farm_log.RedactingFormatter(farm_log.FORMAT).format(rec))
    _hidden(json.dumps(json.loads(farm_log.JsonFormatter().format(rec))))


@pytest.mark.parametrize("password", ["secret/pw", "se#cret", "se?cret", "p@ss@w0rd"])
def test_farm_never_prints_such_a_password(farm_env, password):
    cases = [("FARM_CONTROL_DSN", f"mysql://root:{password}@127.0.0.1:3306/x"),
             ("FARM_REDIS_URL", f"redis://:{password}@127.0.0.1:1/0")]
    for name, url in cases:
        out = run_farm({**farm_env, name: url}, "status", timeout=60)
        assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, out.stderr
        for piece in password.replace("#", "@").replace("?", "@").replace("/", "@").split("@"):
            if len(piece) > 2:
                assert piece not in out.stderr + out.stdout, (piece, out.stderr)
