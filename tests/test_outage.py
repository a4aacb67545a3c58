"""``workers.outage``: a step that needs Redis is skipped while Redis does not answer, the
outage said once when it starts and once when it ends; any other error still raises."""

from __future__ import annotations

import logging

import pytest
import redis

from workers.outage import Outage, unwritable


def _refused() -> None:
    raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")


def test_an_outage_is_said_once_and_its_end_once(caplog):
    outage = Outage("redis://127.0.0.1:6390/0")
    with caplog.at_level(logging.WARNING, logger="workers.outage"):
        assert outage.call(lambda: 7, None) == 7
        assert [outage.call(_refused, "skipped") for _ in range(3)] == ["skipped"] * 3
        assert outage.call(lambda: 8, None) == 8
        assert outage.call(lambda: 9, None) == 9
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("Redis at redis://127.0.0.1:6390/0 does not answer (Error 111")
    assert "replica" not in said[0], said[0]
    assert said[1].startswith("Redis at redis://127.0.0.1:6390/0 answers again after ")
    assert outage.since is None


def test_a_timeout_is_an_outage_too():
    def slow() -> None:
        raise redis.TimeoutError("Timeout reading from 127.0.0.1:6390")
    outage = Outage("redis://127.0.0.1:6390/0")
    assert outage.call(slow, None) is None and outage.since is not None


def test_any_other_error_still_raises():
    def wrong_type() -> None:
        raise redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
    with pytest.raises(redis.ResponseError):
        Outage("redis://127.0.0.1:6390/0").call(wrong_type, None)


def test_a_password_in_the_error_is_not_said(caplog):
    def leaky() -> None:
        raise redis.ConnectionError("cannot reach redis://farm:s3cret@10.0.0.9:6379/0")
    with caplog.at_level(logging.WARNING, logger="workers.outage"):
        Outage("redis://farm:***@10.0.0.9:6379/0").call(leaky, None)
    assert "s3cret" not in caplog.text and "farm:***@10.0.0.9" in caplog.text


@pytest.mark.parametrize("refused", [redis.AuthenticationError("invalid username-password pair"),
                                     redis.exceptions.AuthorizationError("NOPERM")])
def test_a_refused_password_is_not_an_outage(refused):
    """A password or user Redis refuses is the URL to fix, not an outage to wait out."""
    def step() -> None:
        raise refused
    outage = Outage("redis://farm:***@127.0.0.1:6390/0")
    with pytest.raises(type(refused)):
        outage.call(step, None)
    assert outage.since is None


def _read_only() -> None:
    raise redis.exceptions.ReadOnlyError("You can't write against a read only replica.",
                                         status_code="READONLY")


def test_a_redis_refusing_writes_is_an_outage_that_only_a_write_ends(caplog):
    """A demoted master answers reads: a step that only read does not end the outage (the
    supervisor's loop read, then wrote, and said the outage ended and began every tick)."""
    outage = Outage("redis://127.0.0.1:6390/0")
    with caplog.at_level(logging.WARNING, logger="workers.outage"):
        assert outage.call(_read_only, "skipped") == "skipped"
        assert outage.call(lambda: "read", None, writes=False) == "read"
        assert outage.since is not None
        assert outage.call(_read_only, "skipped") == "skipped"
        assert outage.call(lambda: "wrote", None) == "wrote"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("Redis at redis://127.0.0.1:6390/0 refuses writes (READONLY You "
                              "can't write against a read only replica.); the workers keep")
    assert said[0].endswith("FARM_REDIS_URL names a read-only replica: point it at the primary")
    assert said[1].startswith("Redis at redis://127.0.0.1:6390/0 takes writes again after ")
    assert outage.since is None


def test_a_read_ends_an_outage_of_a_redis_that_did_not_answer():
    outage = Outage("redis://127.0.0.1:6390/0")
    outage.call(_refused, None)
    assert outage.call(lambda: "read", None, writes=False) == "read" and outage.since is None


@pytest.mark.parametrize(("error", "expected"), [
    (redis.exceptions.ReadOnlyError("You can't write"), True),
    (redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
     True),
    (redis.exceptions.MasterDownError("Link with MASTER is down"), True),
    (redis.ResponseError("UNBLOCKED force unblock from blocking operation, instance state "
                         "changed (master -> replica?)"), True),
    (redis.ResponseError("Error running script (call to f_9f1a): @user_script:3: "
                         "@user_script: 3: -READONLY You can't write against a read only "
                         "replica."), True),  # Redis 6.2 inside a script
    (redis.ResponseError("Error running script (call to f_9f1a): @user_script:3: "
                         "@user_script: 3: -OOM command not allowed when used memory > "
                         "'maxmemory'."), True),
    (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"), False),
    (redis.ResponseError("ERR unknown command 'BLMOVE'"), False),
    (redis.ConnectionError("Connection refused"), False)])
def test_which_errors_say_redis_takes_no_writes(error, expected):
    assert unwritable(error) is expected
