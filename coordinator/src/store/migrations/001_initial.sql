-- Tessera's metadata in PostgreSQL: one table per kind of record, each row
-- the record's JSON as the sled store keeps it (jsonb, so operators can
-- query it with `body->>'state'`).

CREATE TABLE tessera_jobs (
    id   bigint PRIMARY KEY,
    body jsonb  NOT NULL
);

CREATE TABLE tessera_tasks (
    job  bigint  NOT NULL,
    idx  integer NOT NULL,
    body jsonb   NOT NULL,
    PRIMARY KEY (job, idx)
);

CREATE TABLE tessera_workers (
    id   text  PRIMARY KEY,
    body jsonb NOT NULL
);

CREATE TABLE tessera_users (
    name text  PRIMARY KEY,
    body jsonb NOT NULL
);

CREATE TABLE tessera_grants (
    user_name text NOT NULL,
    digest    text NOT NULL,
    PRIMARY KEY (user_name, digest)
);

CREATE TABLE tessera_archive (
    id      bigint PRIMARY KEY,
    body    jsonb  NOT NULL,
    outputs jsonb  NOT NULL
);

CREATE TABLE tessera_stitched (
    job   bigint  NOT NULL,
    frame integer NOT NULL,
    body  jsonb   NOT NULL,
    PRIMARY KEY (job, frame)
);

CREATE TABLE tessera_meta (
    key   text   PRIMARY KEY,
    value bigint NOT NULL
);

-- Who is active: the coordinator holding the advisory lock bumps the epoch
-- when it takes over, and every write batch checks it (fencing).
CREATE TABLE tessera_leader (
    id     integer PRIMARY KEY CHECK (id = 1),
    epoch  bigint  NOT NULL,
    holder text    NOT NULL,
    url    text    NOT NULL,
    since  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO tessera_leader (id, epoch, holder, url) VALUES (1, 0, '', '');
