-- Least-privilege roles of ki-sidecar in PostgreSQL. Apply to the ki database as a role with CREATEROLE
-- after the migrations (`ki migrate`, run by the operator role that owns the schema), e.g.
--   psql -d ki -f deploy/postgres/roles.sql
-- then give each login its password outside any file:  ALTER ROLE ki_api LOGIN PASSWORD '…';
-- Idempotent: re-running it after a migration grants what new tables need and nothing else.
--
--   ki_api       the search API and the MCP server: reads what search, documents, relations and decisions
--                need; writes only its own statistics and access audit (ki_search_stats, ki_access_audit:
--                insert, and delete for retention).
--   ki_worker    the sync worker, `ki backfill`, `ki reconcile`: reads the structured layer, writes nothing;
--                reads the DLQ operations log (ki_dlq_operations) for its gauges of dead letters waiting.
--   ki_debezium  Debezium: logical replication, the published tables, and its heartbeat row.
--   The operator role (the schema's owner, `database.user` of `ki migrate` and `ki rebuild`) keeps ownership.

DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ki_api') THEN CREATE ROLE ki_api NOLOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ki_worker') THEN CREATE ROLE ki_worker NOLOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ki_debezium') THEN CREATE ROLE ki_debezium NOLOGIN; END IF;
END
$$;

ALTER ROLE ki_debezium REPLICATION;

GRANT USAGE ON SCHEMA public TO ki_api, ki_worker, ki_debezium;

-- The structured layer, read-only for the API and the worker.
GRANT SELECT ON
  projects, matters, ontology_nodes, sources, source_objects, group_memberships, principal_aliases,
  documents, document_versions, source_observations, grants, decision_records, relations, debezium_heartbeat
TO ki_api, ki_worker;

-- The API's own retrieval statistics.
GRANT SELECT, INSERT, DELETE ON ki_search_stats TO ki_api;
-- The access audit (who saw which documents), read back by administrators through the API.
GRANT SELECT, INSERT, DELETE ON ki_access_audit TO ki_api;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO ki_api;
-- The DLQ operations log (`ki dlq`, written by the operator): which dead letters are handled, for the lanes' gauges.
GRANT SELECT ON ki_dlq_operations TO ki_worker;

-- Debezium: the publication's tables (snapshot and schema reads) and its heartbeat upsert.
GRANT SELECT ON
  projects, matters, ontology_nodes, sources, source_objects, group_memberships, principal_aliases,
  documents, document_versions, source_observations, grants, debezium_heartbeat
TO ki_debezium;
GRANT INSERT, UPDATE ON debezium_heartbeat TO ki_debezium;

-- Nobody but the owner changes data: revoke what PUBLIC might have been given by hand.
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public FROM PUBLIC;
