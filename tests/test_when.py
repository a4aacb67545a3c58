"""Legacy DATETIME text to the target's ISO text and unix-seconds sequence."""

from __future__ import annotations

import datetime as dt

import pytest

from loaders.migration import when

EPOCH = dt.datetime(1970, 1, 1)


def _seconds(text: str) -> int:
    """The definition: whole seconds since the epoch, rounded down (UTC, zone ignored)."""
    value = dt.datetime.fromisoformat(text).replace(tzinfo=None)
    return (value - EPOCH) // dt.timedelta(seconds=1)


@pytest.mark.parametrize("text", [
    "2013-04-05 06:07:08", "1970-01-01 00:00:00", "1969-12-31 23:59:59",
    "1969-12-31 23:59:59.500000", "1900-02-28 12:00:01", "0001-01-01 00:00:00",
    "9999-12-31 23:59:59", "2013-04-05T06:07:08+02:00", "2016-02-29 23:59:59.999999"])
def test_seconds_are_whole_seconds_since_the_epoch_rounded_down(text):
    assert when.unix(text) == _seconds(text)


def test_mariadb_text_becomes_iso_utc():
    assert when.parse("2013-04-05 06:07:08") == ("2013-04-05T06:07:08Z", 1365142028)


@pytest.mark.parametrize("text", ["0000-00-00 00:00:00", "2013-02-30 00:00:00", "soon"])
def test_a_zero_or_invalid_date_has_none(text):
    assert when.parse(text) is None
