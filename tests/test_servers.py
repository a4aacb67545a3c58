"""The test helpers' private servers: a binlog server and a real replication pair."""

from __future__ import annotations

import pymysql
import pytest

from tests.servers import PrivateMariaDB, ReplicationPair, slave_status


def test_a_binlog_server_writes_row_events_with_gtids():
    server = PrivateMariaDB.start_binlog()
    try:
        log_bin, fmt = server.sql("SELECT @@log_bin, @@binlog_format")[0]
        assert (log_bin, fmt) == (1, "ROW")
        server.sql("CREATE DATABASE t")
        assert server.sql("SELECT @@gtid_binlog_pos")[0][0] != ""
    finally:
        server.stop()


def test_the_slave_of_a_pair_applies_what_the_master_writes():
    pair = ReplicationPair.start()
    try:
        pair.master.sql("CREATE DATABASE x")
        pair.master.sql("CREATE TABLE x.t (a INT PRIMARY KEY)")
        pair.master.sql("INSERT INTO x.t VALUES (1), (2), (3)")
        pair.wait_caught_up()
        assert pair.slave.sql("SELECT COUNT(*) FROM x.t")[0][0] == 3
        status = slave_status(pair.slave)
        assert status["Slave_SQL_Running"] == "Yes"
        assert status["Gtid_IO_Pos"] == pair.master.sql("SELECT @@gtid_binlog_pos")[0][0]
    finally:
        pair.stop()


def test_a_killed_master_leaves_the_slave_with_what_it_had_received():
    pair = ReplicationPair.start()
    try:
        pair.master.sql("CREATE DATABASE y")
        pair.wait_caught_up()
        pair.master.kill()
        assert pair.slave.sql("SHOW DATABASES LIKE 'y'") == [("y",)]
        with pytest.raises(pymysql.MySQLError):
            pair.master.sql("SELECT 1")
    finally:
        pair.stop()


def test_a_private_server_keeps_its_temporary_files_in_its_own_directory():
    """Not in /tmp, which every process on the machine shares: a benchmark's server lost a
    sort file there mid-run ('Error on delete of ...', errno 2) and failed its chunk."""
    server = PrivateMariaDB.start_binlog()
    try:
        tmpdir = server.sql("SELECT @@tmpdir")[0][0]
        assert tmpdir.rstrip("/") == str(server.datadir.parent)
    finally:
        server.stop()
