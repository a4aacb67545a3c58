"""Before a run starts: a fleet without what this version writes is refused with the fix."""

from __future__ import annotations

import pytest

from farmcore.preflight import preflight
from shardfarm.errors import ConfigError
from sharding.provision import init_databases
from sharding.schema import mod_table
from tests.conftest import run_farm


@pytest.fixture
def fences_dropped(router):
    """The fences of the first bucket of the map's first mod range dropped (a fleet made
    before mod-bucket writes were fenced); everything made again after."""
    first = router.shardmap.mod_ranges[0].lo
    router.run_mod(first, lambda cur: cur.execute(
        f"DROP TABLE {mod_table(first, 'chunk_fences')}"))
    yield first
    init_databases(router)


def test_a_provisioned_fleet_passes(settings, router):
    preflight(settings, router)


def test_a_mod_range_without_fences_is_refused_with_the_command_that_adds_them(
        settings, router, fences_dropped):
    host = router.shardmap.mod_master(fences_dropped).name
    with pytest.raises(ConfigError, match=f"mod bucket {fences_dropped} has no chunk_fences "
                                          f"table on {host}: run 'farm shards init'"):
        preflight(settings, router)


def test_farm_migrate_refuses_it_in_one_line_with_exit_1(farm_env, fences_dropped):
    out = run_farm(farm_env, "migrate")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no chunk_fences table" in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_shards_init_adds_them_again(settings, router, fences_dropped):
    init_databases(router)
    preflight(settings, router)
