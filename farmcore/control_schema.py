"""Tables of the control database: runs, the chunk ledger, the quarantine, verify findings,
export parts and claims, cron state, and masters a promote made read-only (each written by
one module: see ``farmcore``).

Progress lives here, in MySQL, not only in Redis: a Redis that lost everything
loses no work, and ``farm resume`` re-enqueues what is not done.
"""

from __future__ import annotations

from farmcore import utc_times
from shardfarm.mysql.db import connect
from shardfarm.mysql.dsn import DSN

STATEMENTS: list[str] = [
    """CREATE TABLE IF NOT EXISTS runs (
  run_id VARCHAR(40) NOT NULL PRIMARY KEY,
  kind VARCHAR(32) NOT NULL,
  status VARCHAR(16) NOT NULL DEFAULT 'running',
  queue VARCHAR(64) NOT NULL,
  params JSON NOT NULL,
  paused TINYINT(1) NOT NULL DEFAULT 0,
  total_chunks INT NOT NULL DEFAULT 0,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  finished_at DATETIME(3) NULL,
  KEY by_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS chunks (
  run_id VARCHAR(40) NOT NULL,
  chunk_id INT NOT NULL,
  kind VARCHAR(64) NOT NULL,
  args JSON NOT NULL,
  state VARCHAR(12) NOT NULL DEFAULT 'pending',
  attempts INT NOT NULL DEFAULT 0,
  fence BIGINT NOT NULL DEFAULT 0,
  lease_owner VARCHAR(128) NULL,
  lease_expires DATETIME(3) NULL,
  not_before DATETIME(3) NULL,
  rows_read BIGINT NOT NULL DEFAULT 0,
  rows_written BIGINT NOT NULL DEFAULT 0,
  rows_quarantined BIGINT NOT NULL DEFAULT 0,
  counts JSON NULL,
  started_at DATETIME(3) NULL,
  finished_at DATETIME(3) NULL,
  seconds DOUBLE NOT NULL DEFAULT 0,
  last_error VARCHAR(1000) NULL,
  rows_planned BIGINT NULL,
  PRIMARY KEY (run_id, chunk_id),
  KEY by_state (run_id, state)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Rows a chunk was planned with (counted while planning; NULL when unknown): progress by
    # rows. Added to control databases made before it.
    "ALTER TABLE chunks ADD COLUMN IF NOT EXISTS rows_planned BIGINT NULL",
    # When a run was paused and unpaused (resumed_at NULL while paused): rates leave it out.
    """CREATE TABLE IF NOT EXISTS run_pauses (
  run_id VARCHAR(40) NOT NULL,
  paused_at DATETIME(3) NOT NULL,
  resumed_at DATETIME(3) NULL,
  PRIMARY KEY (run_id, paused_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS quarantine (
  run_id VARCHAR(40) NOT NULL,
  legacy_table VARCHAR(64) NOT NULL,
  legacy_key VARCHAR(128) NOT NULL,
  reason VARCHAR(64) NOT NULL,
  detail VARCHAR(500) NULL,
  chunk_id INT NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (run_id, legacy_table, legacy_key),
  KEY by_reason (run_id, reason)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS verify_mismatches (
  run_id VARCHAR(40) NOT NULL,
  chunk_id INT NOT NULL,
  legacy_table VARCHAR(64) NOT NULL,
  legacy_key VARCHAR(128) NOT NULL,
  target VARCHAR(64) NOT NULL,
  problem VARCHAR(300) NOT NULL,
  PRIMARY KEY (run_id, chunk_id, legacy_table, legacy_key, target)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Export parts written (or found intact) per destination file: what finalize lists in
    # _manifest.json, and what a re-export compares an existing part with before skipping it.
    # ref = sha256(dest NUL path), folder = sha256(dest NUL "table/dt=date/").
    """CREATE TABLE IF NOT EXISTS export_parts (
  ref CHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
  folder CHAR(64) CHARACTER SET ascii NOT NULL,
  dest VARCHAR(1000) NOT NULL,
  path VARCHAR(255) NOT NULL,
  shard INT NOT NULL,
  row_count BIGINT NOT NULL,
  bytes BIGINT NOT NULL,
  sha256 CHAR(64) CHARACTER SET ascii NOT NULL,
  run_id VARCHAR(40) NOT NULL,
  written_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  KEY by_folder (folder, run_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Which export run writes a folder (sha256(dest NUL "table/dt=date/")): one at a time.
    """CREATE TABLE IF NOT EXISTS export_claims (
  folder CHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
  run_id VARCHAR(40) NOT NULL,
  claimed_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Short leases (e.g. a folder's finalizer): a row, not a connection's GET_LOCK.
    """CREATE TABLE IF NOT EXISTS export_locks (
  name CHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
  token CHAR(32) CHARACTER SET ascii NOT NULL,
  expires DATETIME(3) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # The last schedule slot each 'farm cron' entry fired for (durable: a lost Redis neither
    # re-fires a night nor forgets one).
    """CREATE TABLE IF NOT EXISTS cron_state (
  name VARCHAR(20) NOT NULL PRIMARY KEY,
  last_slot DATETIME NOT NULL,
  run_id VARCHAR(40) NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # A pruned run's summary ('farm runs prune', farmcore.prune): its chunks are gone.
    """CREATE TABLE IF NOT EXISTS runs_archive (
  run_id VARCHAR(40) NOT NULL PRIMARY KEY,
  kind VARCHAR(32) NOT NULL,
  status VARCHAR(16) NOT NULL,
  total_chunks INT NOT NULL,
  chunks_done INT NOT NULL,
  chunks_failed INT NOT NULL,
  rows_written BIGINT NOT NULL,
  created_at DATETIME(3) NOT NULL,
  finished_at DATETIME(3) NULL,
  pruned_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Indexes for a ledger of a million chunks, added to control databases made before them:
    # failed/running chunks of every run ('farm failed', lease expiry) without a scan, runs
    # by kind ('farm runs --kind') and by status and age ('farm runs prune').
    "ALTER TABLE chunks ADD INDEX IF NOT EXISTS by_state_any (state, lease_expires)",
    "ALTER TABLE runs ADD INDEX IF NOT EXISTS by_kind (kind, created_at)",
    "ALTER TABLE runs ADD INDEX IF NOT EXISTS by_status (status, finished_at)",
    # A pruned run's fence rows are still on the shards (farmcore.prune forgets them a day
    # after the run ended; runs archived before this column get theirs forgotten then too).
    "ALTER TABLE runs_archive ADD COLUMN IF NOT EXISTS fences_left TINYINT(1) NOT NULL "
    "DEFAULT 1, ADD INDEX IF NOT EXISTS by_fences (fences_left, finished_at)",
    # whether this database's times were moved to UTC (``farmcore.utc_times``)
    """CREATE TABLE IF NOT EXISTS control_clock (
  id TINYINT NOT NULL PRIMARY KEY,
  zone VARCHAR(64) NOT NULL,
  converted_at DATETIME(3) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # when 'farm cancel' ended the run (a global 'farm retry-failed' leaves it alone)
    "ALTER TABLE runs ADD COLUMN IF NOT EXISTS cancelled_at DATETIME(3) NULL",
    # a run cancelled before 'cancelled' was a status ended as 'failed' (farmcore.runstate)
    "UPDATE runs SET status = 'cancelled' WHERE status = 'failed' AND cancelled_at IS NOT NULL",
    # chunks claimed since a time ('farm sync': did a migration write during an apply?)
    "ALTER TABLE chunks ADD INDEX IF NOT EXISTS by_started (started_at)",
    # a chunk's quarantine rows, replaced by each attempt (farmcore.quarantine.record): without
    # it that DELETE scans and, in REPEATABLE READ, locks every quarantined row of the run, so
    # the chunks of a run recording at once waited for each other
    "ALTER TABLE quarantine ADD INDEX IF NOT EXISTS by_chunk (run_id, chunk_id)",
    # A run that ended keeps its totals here (NULL while it runs: summed from its chunks).
    "ALTER TABLE runs ADD COLUMN IF NOT EXISTS chunks_done INT NULL, "
    "ADD COLUMN IF NOT EXISTS chunks_failed INT NULL, "
    "ADD COLUMN IF NOT EXISTS rows_written BIGINT NULL",
    # farm sync: the leader's lease (fenced) and the binlog position applied up to.
    """CREATE TABLE IF NOT EXISTS sync_state (
  name VARCHAR(16) NOT NULL PRIMARY KEY,
  owner VARCHAR(128) NULL,
  host VARCHAR(128) NULL,
  fence BIGINT NOT NULL DEFAULT 0,
  expires DATETIME(3) NULL,
  run_id VARCHAR(40) NULL,
  gtid VARCHAR(1000) NULL,
  event_time BIGINT NULL,
  applied JSON NULL,
  checkpointed_at DATETIME(3) NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # the checkpoint an apply started from, and its leader's fence, from the start of an
    # apply until that leader's checkpoint: the apply may not be recorded ('farm sync')
    "ALTER TABLE sync_state ADD COLUMN IF NOT EXISTS applying_from VARCHAR(1000) NULL, "
    "ADD COLUMN IF NOT EXISTS applying_to VARCHAR(1000) NULL, "
    "ADD COLUMN IF NOT EXISTS applying_fence BIGINT NULL",
    # which farm this control database is (farmcore.identity): made once, never changed
    """CREATE TABLE IF NOT EXISTS farm_identity (
  one TINYINT NOT NULL PRIMARY KEY,
  farm_id CHAR(36) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    "INSERT IGNORE INTO farm_identity (one, farm_id) VALUES (1, UUID())",
    # masters a 'farm shards promote' is making read-only, until it is done with them
    # (farmcore.readonly): what a promote that stopped left behind
    """CREATE TABLE IF NOT EXISTS promote_read_only (
  master VARCHAR(255) NOT NULL PRIMARY KEY,
  promoting VARCHAR(255) NOT NULL,
  accept_loss TINYINT(1) NOT NULL DEFAULT 0,
  since DATETIME(3) NOT NULL,
  KEY by_promoting (promoting)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
]


def ensure(dsn: DSN) -> None:
    """Create every control table that does not exist yet; times written before every
    session was UTC are moved to UTC, once (``farmcore.utc_times``)."""
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            for sql in STATEMENTS:
                cur.execute(sql)
            utc_times.convert_once(cur)
    finally:
        conn.close()
