"""The cut-over verdict line (the cut-over itself runs in tests/test_sync*.py)."""

from workers.cutover import Verdict


def test_the_verdict_names_failed_verify_chunks_and_how_to_see_them():
    line = Verdict(False, "0-1-9", 0, "verify-x", False, failed_chunks=2).line()
    assert line == ("cutover: target NOT exact at legacy binlog position 0-1-9: 0 mismatch(es), "
                    "2 verify chunk(s) failed: 'farm failed --run verify-x' (verify run verify-x)")


def test_an_exact_frozen_cutover_says_the_legacy_server_stays_read_only():
    line = Verdict(True, "0-1-9", 0, "verify-x", True).line()
    assert line.startswith("cutover: target exact at legacy binlog position 0-1-9: 0 mismatch")
    assert line.endswith("; legacy server left read-only") and "failed" not in line
