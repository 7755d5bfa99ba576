-- kvfleet history schema: undo revision 0009 (each endpoint's latest state kept at write time).
DROP TRIGGER IF EXISTS step_events_endpoint_state_ins ON step_events;
DROP TRIGGER IF EXISTS step_events_endpoint_state_upd ON step_events;
DROP TRIGGER IF EXISTS step_events_endpoint_state_del ON step_events;
DROP TRIGGER IF EXISTS hit_verifications_endpoint_state_ins ON hit_verifications;
DROP TRIGGER IF EXISTS hit_verifications_endpoint_state_upd ON hit_verifications;
DROP TRIGGER IF EXISTS hit_verifications_endpoint_state_del ON hit_verifications;
DROP TRIGGER IF EXISTS drift_findings_endpoint_state_ins ON drift_findings;
DROP TRIGGER IF EXISTS drift_findings_endpoint_state_upd ON drift_findings;
DROP TRIGGER IF EXISTS drift_findings_endpoint_state_del ON drift_findings;
DROP FUNCTION IF EXISTS kvfleet_endpoint_state_steps();
DROP FUNCTION IF EXISTS kvfleet_endpoint_state_verifications();
DROP FUNCTION IF EXISTS kvfleet_endpoint_state_drift();
DROP FUNCTION IF EXISTS kvfleet_endpoint_state_refresh(text[], text[]);
DROP TABLE IF EXISTS endpoint_state;
DROP INDEX IF EXISTS step_events_endpoint_keyless;
