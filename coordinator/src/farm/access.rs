//! Who may act for which worker, report which lease, and use which blob.
//!
//! - A worker belongs to the user (token holder) that registered it: only
//!   that token may lease, report or send telemetry for it, and a
//!   registration naming another token's worker as its previous id gets a
//!   fresh id instead of taking the worker over.
//! - A lease id (`job.task.grant`) is checked against the worker it was
//!   granted to, so guessing one gives nothing.
//! - Blobs are possessed by proof: a user possesses the blobs it uploaded
//!   (the upload is re-hashed) and those its jobs reference. `MissingBlobs`
//!   answers only about possessed blobs, a job may name only possessed blobs,
//!   and a worker may report only outputs its token uploaded.
//! - Reads are authorised by reference: a user reads what it possesses; a
//!   worker reads a job's scene, file set and the set's files only while one
//!   of its workers holds a lease of that job; an admin reads anything.
//!
//! The gRPC handlers call these checks before the domain function they guard.

use super::*;

/// Leases remembered with their holders before the memory is pruned.
const HOLDERS_BEFORE_PRUNING: usize = 4096;

/// Possession and lease-holder bookkeeping, part of the farm's [`State`].
#[derive(Debug, Default)]
pub(super) struct AccessState {
    /// Blobs each user uploaded or was granted (durable: [`Record::Grant`]).
    grants: HashMap<String, HashSet<Digest>>,
    /// Blobs each user's jobs referenced when last looked: a cache, rebuilt
    /// from the jobs when a read misses it (references only ever grow).
    referenced: HashMap<String, HashSet<Digest>>,
    /// The worker each grant went to, so that a result from an older grant
    /// (accepted when it is the first) is checked against its own holder.
    /// In memory only; after a restart or a failover, holders are found in
    /// the tasks: the current grant's in its state, ended grants' in its
    /// attempts (see `Farm::lease_holder`).
    holders: HashMap<LeaseId, WorkerId>,
    /// How many holders were left at the last pruning.
    kept: usize,
    /// The entries of each file set, sorted, for workers' reads.
    sorted_files: HashMap<Digest, Arc<[Digest]>>,
}

impl AccessState {
    /// The bookkeeping for `grants` as the store holds them.
    pub(super) fn from_grants(grants: BTreeSet<(String, Digest)>) -> Self {
        let mut by_user: HashMap<String, HashSet<Digest>> = HashMap::new();
        for (user, d) in grants {
            by_user.entry(user).or_default().insert(d);
        }
        Self {
            grants: by_user,
            ..Default::default()
        }
    }

    /// Drops what was derived from a job that left memory: its file set's
    /// sorted entries (when no other job has that set) and its owner's
    /// cache of referenced blobs, which is rebuilt from the jobs left.
    pub(super) fn forget_job(&mut self, owner: &str, file_set: Option<&Digest>) {
        if let Some(d) = file_set {
            self.sorted_files.remove(d);
        }
        self.referenced.remove(owner);
    }
}

impl Farm {
    /// Fails with `permission denied` unless `who` registered `worker`. An
    /// unknown worker passes: the call it guards answers "not found", which
    /// makes a worker register again. So does a worker registered before
    /// workers had owners: it registers again and gets an id of its own.
    pub fn check_worker(&self, who: &Identity, worker: &WorkerId) -> Result<(), Error> {
        let st = self.lock();
        match st.workers.get(worker) {
            Some(w) if w.owner.is_empty() => Err(Error::NotFound(format!(
                "worker {worker} (it was registered without an owner; register again)"
            ))),
            Some(w) if w.owner != who.name => Err(Error::PermissionDenied(format!(
                "worker {worker} is not registered with this token; a worker token acts only for the workers it registered"
            ))),
            _ => Ok(()),
        }
    }

    /// Fails with `permission denied` unless `lease` was granted to a worker
    /// that `who` registered. A lease whose holder is no longer known (it
    /// ended before a restart or a failover and left no attempt on record)
    /// gets the true reason it ended, as [`Farm::stale_reason`] words it, so
    /// that its worker drops the task; "not granted" is kept for ids that
    /// were never granted.
    pub fn check_lease(&self, who: &Identity, lease: LeaseId) -> Result<(), Error> {
        Self::lease_checked(&self.lock(), who, lease)
    }

    /// [`Farm::check_lease`] under the lock.
    pub(super) fn lease_checked(st: &State, who: &Identity, lease: LeaseId) -> Result<(), Error> {
        match Self::lease_holder(st, lease) {
            Some(w) if st.workers.get(&w).is_some_and(|r| r.owner == who.name) => Ok(()),
            Some(w) => Err(Error::PermissionDenied(format!(
                "lease {lease} is held by worker {w}, which is not registered with this token; report only the leases of your own workers"
            ))),
            None => Err(Self::unknown_holder(st, lease)),
        }
    }

    /// What a report on `lease` is told when nobody is known to have held it.
    fn unknown_holder(st: &State, lease: LeaseId) -> Error {
        let granted = st
            .tasks
            .get(&lease.job)
            .and_then(|t| t.get(lease.task as usize))
            .is_some_and(|t| lease.grant >= 1 && lease.grant <= t.grants);
        if granted {
            if let Some(why) = Self::stale_reason(st, lease) {
                return why;
            }
        } else if st.archived.contains_key(&lease.job) {
            return Error::NotFound(format!(
                "job {} of lease {lease} (it ended and was archived); drop this task",
                lease.job
            ));
        }
        Error::PermissionDenied(format!(
            "lease {lease} was not granted to a worker registered with this token; report only the leases of your own workers"
        ))
    }

    /// [`Farm::check_lease`], and every output must be a blob `who` uploaded:
    /// a worker cannot make another user's blob part of a job.
    pub fn check_complete(
        &self,
        who: &Identity,
        lease: LeaseId,
        outputs: &[FrameOutput],
    ) -> Result<(), Error> {
        self.check_lease(who, lease)?;
        let st = self.lock();
        match outputs.iter().find(|o| !Self::possesses(&st, who, &o.digest)) {
            Some(o) => Err(Error::invalid(format!(
                "frame {} names blob {} which this worker's token did not upload; upload it, then report the result",
                o.frame, o.digest
            ))),
            None => Ok(()),
        }
    }

    /// Checks what a job names before it is submitted: its scene, its file
    /// set and every file in the set must be blobs `who` possesses (the same
    /// answer as for a blob never uploaded, so a learned digest tells
    /// nothing), and the scene's output must fit `--max-pixels`.
    pub fn check_submission(&self, who: &Identity, sub: &Submission) -> Result<(), Error> {
        self.check_output_size(sub)?;
        self.check_after(Some(who), &sub.after)?;
        let named =
            std::iter::once(("scene", sub.scene)).chain(sub.file_set.map(|d| ("file set", d)));
        for (what, d) in named {
            // Possession under the lock, released before the blob store is
            // asked: a HEAD on S3 must not hold up every other call.
            let possessed = Self::possesses(&self.lock(), who, &d);
            if !(possessed && self.blobs.contains(&d)) {
                return Err(Error::invalid(format!(
                    "{what} {d} has not been uploaded by you; upload it before submitting (tessera submit does this)"
                )));
            }
        }
        let Some(set) = sub.file_set else {
            return Ok(());
        };
        // The set is the caller's own: its contents may be read and checked.
        let (files, info) = crate::model::fileset::check(&self.blobs.read(&set)?, &sub.scene)?;
        // Possession under the lock, then the blob store without it: a HEAD
        // on S3 must not hold up every other call.
        let own: Vec<(&str, &Digest, bool)> = {
            let st = self.lock();
            files
                .files
                .iter()
                .filter(|f| f.shared.is_empty())
                .zip(&info.blobs)
                .map(|(f, d)| (f.path.as_str(), d, Self::possesses(&st, who, d)))
                .collect()
        };
        let foreign: Vec<&str> = own
            .iter()
            .filter(|(_, d, possessed)| !*possessed || !self.blobs.contains(d))
            .map(|(path, _, _)| *path)
            .take(10)
            .collect();
        if foreign.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "the file set names files that were not uploaded by you ({}); upload them first (tessera submit does this)",
                foreign.join(", ")
            )))
        }
    }

    /// The digests among `digests` that `who` should upload: those the store
    /// lacks, and those `who` does not possess (whether another user stored
    /// them is not revealed; the upload proves possession and is stored once).
    pub fn missing_for(&self, who: &Identity, digests: &[Digest]) -> Vec<Digest> {
        // Possession under the lock, the blob store after it (see
        // `check_submission`).
        let possessed: Vec<bool> = {
            let st = self.lock();
            digests
                .iter()
                .map(|d| Self::possesses(&st, who, d))
                .collect()
        };
        digests
            .iter()
            .zip(possessed)
            .filter(|(d, possessed)| !*possessed || !self.blobs.contains(d))
            .map(|(d, _)| *d)
            .collect()
    }

    /// Records that `who` uploaded `d` (its bytes were re-hashed), durably
    /// (not for admins, who possess every blob). Returns what to report as
    /// "already present": whether `who` possessed it before, never whether
    /// someone else had stored it.
    pub fn record_upload(
        &self,
        who: &Identity,
        d: Digest,
        stored_before: bool,
    ) -> Result<bool, Error> {
        let mut st = self.lock();
        let had = Self::possesses(&st, who, &d);
        if !who.is_admin()
            && !st
                .access
                .grants
                .get(&who.name)
                .is_some_and(|g| g.contains(&d))
        {
            let ticket = self.commit(&st, vec![Owned::Grant(who.name.clone(), d)]);
            st.access
                .grants
                .entry(who.name.clone())
                .or_default()
                .insert(d);
            drop(st);
            ticket.wait()?;
        }
        Ok(stored_before && had)
    }

    /// Fails with "not found" (as for a missing blob) unless `who` may read
    /// `d`: an admin reads anything; a user what it uploaded or its jobs use;
    /// a worker a job's scene, file set and the set's files while one of its
    /// workers holds a lease of that job.
    pub fn check_read(&self, who: &Identity, d: &Digest) -> Result<(), Error> {
        let mut st = self.lock();
        let allowed = match who.role {
            Role::Admin => true,
            Role::Worker => Self::leases_reference(&mut st, who, d),
            Role::Metrics => false,
            Role::User => {
                Self::possesses(&st, who, d) || {
                    Self::refresh_referenced(&mut st, &who.name);
                    Self::possesses(&st, who, d)
                }
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(Error::NotFound(format!("blob {d}")))
        }
    }

    /// Issues a new token for user `name` with `role`, creating the user or
    /// replacing its old token (which stops working at once). For the
    /// embedded farm of `tessera render`, which runs with a token of its own.
    pub fn issue_token(&self, name: &str, role: Role) -> Result<String, Error> {
        auth::check_name(name)?;
        let token = auth::new_token()?;
        let record = UserRecord {
            name: name.to_string(),
            role,
            token_hash: auth::token_hash(&token),
            created_ms: self.clock.now_ms(),
        };
        let mut st = self.lock();
        let ticket = self.commit(&st, vec![Owned::User(record.clone())]);
        let old = st.users.insert(name.to_string(), record.clone());
        drop(st);
        ticket.wait()?;
        if let Some(old) = old {
            self.tokens
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&old.token_hash);
        }
        self.remember_token(&record);
        Ok(token)
    }

    /// Checks a registration against `--max-slots` and
    /// `--max-workers-per-token`; returns the previous id it may take up
    /// again (only one its own token registered).
    pub(super) fn check_registration(
        &self,
        st: &State,
        reg: &Registration,
        now: u64,
    ) -> Result<Option<WorkerId>, Error> {
        let max = self.config.max_slots;
        let offered = [
            (reg.slots as usize, "slots", "start it with fewer --slots"),
            (
                reg.slot_caps.len(),
                "slot descriptions",
                "start it with fewer --slots",
            ),
            (
                reg.gpus.len(),
                "GPUs",
                "split the machine among workers with fewer GPUs each",
            ),
        ];
        if let Some((n, what, fix)) = offered.iter().find(|(n, _, _)| *n > max as usize) {
            return Err(Error::invalid(format!(
                "the worker reports {n} {what}, over the limit of {max} (--max-slots); {fix}, or ask the farm's admin to raise --max-slots"
            )));
        }
        let resumed = match &reg.previous {
            Some(p) => match st.workers.get(p) {
                Some(w) if w.owner == reg.owner => Some(p.clone()),
                Some(_) => {
                    tracing::warn!(worker = %p, user = %reg.owner, "a registration named another token's worker as its previous id; it gets a fresh id");
                    None
                }
                None => None,
            },
            None => None,
        };
        if resumed.is_none() {
            let limit = self.config.max_workers_per_token;
            let online = st
                .workers
                .values()
                .filter(|w| w.owner == reg.owner && self.online(w, now))
                .count();
            if online >= limit as usize {
                return Err(Error::invalid(format!(
                    "the token of {} already has {online} workers online, the limit (--max-workers-per-token {limit}); stop one, or give this machine a worker token of its own",
                    reg.owner
                )));
            }
        }
        Ok(resumed)
    }

    /// Remembers that grant `lease` went to `worker`, forgetting holders of
    /// finished tasks now and then.
    pub(super) fn note_grant(st: &mut State, lease: LeaseId, worker: &WorkerId) {
        st.access.holders.insert(lease, worker.clone());
        let len = st.access.holders.len();
        if len > HOLDERS_BEFORE_PRUNING.max(2 * st.access.kept) {
            let State { access, tasks, .. } = st;
            access.holders.retain(|l, _| {
                tasks
                    .get(&l.job)
                    .and_then(|t| t.get(l.task as usize))
                    .is_some_and(|t| {
                        matches!(t.state, TaskState::Queued | TaskState::Leased { .. })
                    })
            });
            access.kept = access.holders.len();
        }
    }

    /// The worker grant `lease` went to, when known: remembered since the
    /// grant, the task's current holder, or the holder of an ended grant
    /// as its attempt records it (durable, so known after a failover too).
    fn lease_holder(st: &State, lease: LeaseId) -> Option<WorkerId> {
        if let Some(w) = st.access.holders.get(&lease) {
            return Some(w.clone());
        }
        let task = st.tasks.get(&lease.job)?.get(lease.task as usize)?;
        match &task.state {
            TaskState::Leased { worker, grant, .. } if *grant == lease.grant => {
                Some(worker.clone())
            }
            _ => task
                .attempts
                .iter()
                .rev()
                .find(|a| a.grant == lease.grant)
                .map(|a| a.worker.clone()),
        }
    }

    /// Whether `who` uploaded `d`, was granted it, or (as last looked) one of
    /// its jobs references it. Admins possess everything.
    fn possesses(st: &State, who: &Identity, d: &Digest) -> bool {
        let has =
            |m: &HashMap<String, HashSet<Digest>>| m.get(&who.name).is_some_and(|s| s.contains(d));
        who.is_admin() || has(&st.access.grants) || has(&st.access.referenced)
    }

    /// Rebuilds the cache of blobs `user`'s jobs reference.
    fn refresh_referenced(st: &mut State, user: &str) {
        let mut set = HashSet::new();
        for job in st.jobs.values().filter(|j| j.owner == user) {
            let tasks = st.tasks.get(&job.id).map_or(&[][..], |t| t.as_slice());
            set.extend(refs::all_refs(job, st.files_of(job), tasks));
        }
        st.access.referenced.insert(user.to_string(), set);
    }

    /// Whether `d` is the scene, the file set or a file of the set of a job
    /// that a worker of `who` holds a lease of.
    fn leases_reference(st: &mut State, who: &Identity, d: &Digest) -> bool {
        let holds = |st: &State, job: &Job| {
            let (Some(tasks), Some(index)) = (st.tasks.get(&job.id), st.schedule.job(job.id))
            else {
                return false;
            };
            index.leased().iter().any(|&i| {
                tasks[i as usize]
                    .holder()
                    .and_then(|h| st.workers.get(h))
                    .is_some_and(|w| w.owner == who.name)
            })
        };
        let open: Vec<JobId> = st
            .jobs
            .values()
            .filter(|j| !j.state.is_final())
            .map(|j| j.id)
            .collect();
        // Only sets of open jobs are looked up; forget the others.
        let sets: HashSet<Digest> = open.iter().filter_map(|id| st.jobs[id].file_set).collect();
        st.access.sorted_files.retain(|d, _| sets.contains(d));
        for id in open {
            let State {
                jobs,
                file_sets,
                access,
                ..
            } = &mut *st;
            let job = &jobs[&id];
            let in_set = |set: Digest| {
                let sorted = access.sorted_files.entry(set).or_insert_with(|| {
                    let mut v = file_sets.get(&set).map_or_else(Vec::new, |f| f.to_vec());
                    v.sort_unstable();
                    v.into()
                });
                sorted.binary_search(d).is_ok()
            };
            let named =
                job.scene == *d || job.file_set == Some(*d) || job.file_set.is_some_and(in_set);
            if named && holds(st, &st.jobs[&id]) {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests;
