-- Leadership is a lease the active coordinator renews: a standby takes over
-- once it expired on the server's clock, whatever the old active's sessions
-- still hold. `session` is the application_name of the holder's sessions,
-- which the coordinator taking over ends (pg_terminate_backend).
ALTER TABLE tessera_leader
    ADD COLUMN expires_at timestamptz NOT NULL DEFAULT '-infinity',
    ADD COLUMN session    text        NOT NULL DEFAULT '';
