"""DSNs: TLS parameters mapped to PyMySQL's arguments, anything else refused in one line."""

from __future__ import annotations

import pytest

from shardfarm.errors import ConfigError
from shardfarm.mysql.dsn import DSN, Host


def test_plain_dsn_has_no_tls():
    dsn = DSN.parse("mysql://u:pw@db.example:3307/legacy", what="FARM_LEGACY_DSN")
    assert dsn.tls == () and dsn.tls_args() == {}
    assert dsn.connect_args() == {"host": "db.example", "port": 3307, "user": "u",
                                  "password": "pw"}
    assert dsn.name == "legacy"


def test_ca_and_verify_map_to_pymysql_arguments():
    dsn = DSN.parse("mysql://u:pw@h:3306/db?ssl_ca=/etc/ca.pem&ssl_verify=1")
    assert dsn.tls_args() == {"ssl_ca": "/etc/ca.pem", "ssl_verify_cert": True,
                              "ssl_verify_identity": True}


def test_ca_alone_verifies_and_verify_0_only_encrypts():
    assert DSN.parse("mysql://u@h/db?ssl_ca=/ca.pem").tls_args()["ssl_verify_identity"]
    args = DSN.parse("mysql://u@h/db?ssl_ca=/ca.pem&ssl_verify=0").tls_args()
    assert args == {"ssl_ca": "/ca.pem", "ssl_verify_cert": False,
                    "ssl_verify_identity": False}


def test_client_certificate():
    dsn = DSN.parse("mysql://u@h/db?ssl_ca=/ca.pem&ssl_cert=/c.pem&ssl_key=/k.pem")
    assert dsn.tls_args() == {"ssl_ca": "/ca.pem", "ssl_cert": "/c.pem", "ssl_key": "/k.pem",
                              "ssl_verify_cert": True, "ssl_verify_identity": True}


def test_str_and_url_keep_tls_and_hide_the_password():
    text = "mysql://u:hunter2@h:3306/db?ssl_ca=%2Fetc%2Fca.pem&ssl_verify=1"
    dsn = DSN.parse(text)
    assert "hunter2" not in str(dsn) + repr(dsn)
    assert "ssl_ca=%2Fetc%2Fca.pem" in str(dsn)
    assert DSN.parse(dsn.url()) == dsn and "hunter2" in dsn.url()


@pytest.mark.parametrize("query,why", [
    ("sslca=/x", "unknown parameter 'sslca'"),
    ("charset=latin1", "unknown parameter 'charset'"),
    ("ssl_ca=/a&ssl_ca=/b", "twice"),
    ("ssl_ca=", "needs a value"),
    ("ssl_ca=/a&ssl_verify=maybe", "ssl_verify must be 0 or 1"),
    ("ssl_verify=1", "needs ssl_ca"),
    ("ssl_cert=/c.pem", "go together"),
    ("ssl_key=/k.pem&ssl_ca=/a", "go together"),
    ("&&=", "malformed"),
])
def test_bad_query_is_one_line_without_password(query, why):
    with pytest.raises(ConfigError) as exc:
        DSN.parse(f"mysql://u:hunter2@h/db?{query}", what="FARM_LEGACY_DSN")
    msg = str(exc.value)
    assert msg.startswith("bad FARM_LEGACY_DSN: ") and why in msg
    assert "\n" not in msg and "hunter2" not in msg


def test_missing_ca_file_is_one_line_naming_the_variable(tmp_path):
    from shardfarm.mysql.db import connect
    dsn = DSN.parse(f"mysql://u:hunter2@127.0.0.1:1/db?ssl_ca={tmp_path}/none.pem",
                    what="FARM_LEGACY_DSN")
    with pytest.raises(ConfigError) as exc:
        connect(dsn)
    msg = str(exc.value)
    assert "FARM_LEGACY_DSN" in msg and "none.pem" in msg and "hunter2" not in msg


def test_a_dsn_is_the_host_of_its_server_named_after_its_variable():
    dsn = DSN.parse("mysql://u:hunter2@db.example:3307/ctl?ssl_ca=/ca.pem",
                    what="FARM_CONTROL_DSN")
    assert isinstance(dsn, Host)
    assert (dsn.name, dsn.server, dsn.database) == ("control", ("db.example", 3307, "u"), "ctl")
    assert dsn.tls_args()["ssl_ca"] == "/ca.pem"
    assert "hunter2" not in repr(dsn) and "hunter2" not in str(dsn)
    assert DSN.parse("mysql://u@h/db").name == "mysql"
