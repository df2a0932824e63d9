//! Workers: registration, whether they are online, their snapshots and GPU telemetry.

use super::*;

impl Farm {
    /// Registers a worker (or welcomes one back) and returns its id and the lease TTL.
    pub fn register(&self, reg: Registration) -> Result<(WorkerId, u64), Error> {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        let id = match self.check_registration(&st, &reg, now)? {
            Some(p) => p,
            None => {
                let n = st.next_worker;
                let mut id;
                let mut k = n;
                loop {
                    id = WorkerId(format!("w{k}"));
                    if !st.workers.contains_key(&id) {
                        break;
                    }
                    k += 1;
                }
                st.next_worker = k + 1;
                id
            }
        };
        let old = st.workers.get(&id);
        // A worker coming back keeps what it was caught doing.
        let suspect = verification::inherited_suspicion(&st, old, &reg.owner, &reg.name);
        let runtimes = runtimes(&reg);
        let record = WorkerRecord {
            id: id.clone(),
            name: reg
                .name
                .chars()
                .filter(|c| !c.is_control())
                .take(100)
                .collect(),
            slots: reg.slots.clamp(1, 1024),
            device: reg.device,
            blender_version: reg.blender_version,
            cpu_cores: reg.cpu_cores,
            registered_ms: now,
            last_seen_ms: now,
            tasks_done: old.map_or(0, |o| o.tasks_done),
            tasks_failed: old.map_or(0, |o| o.tasks_failed),
            gpus: reg.gpus,
            slot_caps: reg.slot_caps,
            tags: reg.tags,
            memory_bytes: reg.memory_bytes,
            notes: reg.notes,
            runtimes,
            features: reg.features,
            owner: reg.owner,
            price_per_hour: crate::model::usage::check_price(reg.price_per_hour)?,
            capacity: reg.capacity,
            untrusted: reg.untrusted,
            suspect,
        };
        tracing::info!(worker = %id, name = %record.name, slots = record.slots, "worker registered");
        let ticket = self.commit(&st, vec![Owned::Worker(record.clone())]);
        let came_back = old.is_some();
        st.workers.insert(id.clone(), record);
        let retried = if came_back {
            self.retry_machine_failures(&mut st, &id)
        } else {
            Vec::new()
        };
        st.announce(FarmEvent::Worker(id.clone()));
        drop(st);
        ticket.wait()?;
        for t in retried {
            t.wait()?;
        }
        Ok((id, self.config.lease_ttl_ms))
    }

    pub(super) fn touch(st: &mut State, worker: &WorkerId, now: u64) -> Result<(), Error> {
        let w = st
            .workers
            .get_mut(worker)
            .ok_or_else(|| Error::NotFound(format!("worker {worker} (register again)")))?;
        w.last_seen_ms = now;
        Ok(())
    }

    /// A worker that comes back (restarted, perhaps once its machine was
    /// fixed) may try again the queued tasks that failed on its machine:
    /// otherwise, once the workers that could take them leave, they wait
    /// for ever. Scans only the open jobs this worker has failed.
    fn retry_machine_failures(&self, st: &mut State, worker: &WorkerId) -> Vec<Ticket> {
        let jobs: Vec<JobId> = st
            .jobs
            .values()
            .filter(|j| !j.state.is_final() && j.failures_by_worker.contains_key(&worker.0))
            .map(|j| j.id)
            .collect();
        let mut tickets = Vec::new();
        for id in jobs {
            let changed: Vec<Task> = st.tasks[&id]
                .iter()
                .filter(|t| t.state == TaskState::Queued && t.machine_failed_on.contains(worker))
                .map(|t| {
                    let mut t = Task::clone(t);
                    t.machine_failed_on.retain(|w| w != worker);
                    t
                })
                .collect();
            if changed.is_empty() {
                continue;
            }
            tracing::info!(job = %id, worker = %worker, tasks = changed.len(), "a worker came back: the tasks that failed on its machine may go to it again");
            let job = st.jobs[&id].clone();
            tickets.push(self.save(st, job, changed, Vec::new()));
        }
        tickets
    }

    pub(super) fn online(&self, w: &WorkerRecord, now: u64) -> bool {
        now.saturating_sub(w.last_seen_ms) <= 2 * self.config.lease_ttl_ms
    }

    /// Every worker.
    pub fn workers(&self) -> Vec<WorkerSnapshot> {
        let now = self.clock.now_ms();
        let st = self.lock();
        st.workers
            .values()
            .map(|w| WorkerSnapshot {
                record: w.clone(),
                online: self.online(w, now),
                running: st.schedule.held_by(&w.id).map_or(0, |h| h.len() as u32),
                in_hand: st
                    .schedule
                    .held_by(&w.id)
                    .map(|h| h.iter().copied().collect())
                    .unwrap_or_default(),
                drain: st.health.get(&w.id).and_then(|h| h.drain.clone()),
            })
            .collect()
    }

    /// Takes a worker's GPU telemetry (and slots whose capability changed),
    /// and drains or restores the worker by its GPUs' health.
    pub fn telemetry(
        &self,
        worker: &WorkerId,
        gpus: Vec<Gpu>,
        slots: Vec<SlotCap>,
    ) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let limits = self.config.health;
        let mut st = self.lock();
        Self::touch(&mut st, worker, now)?;
        let State {
            workers, health, ..
        } = &mut *st;
        let record = workers.get_mut(worker).expect("touched worker exists");
        for g in gpus {
            if let Some(mine) = record.gpus.iter_mut().find(|m| m.index == g.index) {
                mine.telemetry = g.telemetry;
            }
        }
        let mut caps_changed = false;
        for s in slots {
            caps_changed = true;
            match record.slot_caps.iter_mut().find(|c| c.slot == s.slot) {
                Some(c) => *c = s,
                None => record.slot_caps.push(s),
            }
        }
        let h = health.entry(worker.clone()).or_default();
        let before = h.drain.clone();
        let after = h.assess(&record.gpus, limits, now);
        match (&before, &after) {
            (None, Some(why)) => tracing::warn!(worker = %worker, "draining: {why}"),
            (Some(_), None) => tracing::info!(worker = %worker, "healthy again; back in service"),
            _ => {}
        }
        let ticket = if caps_changed {
            let record = record.clone();
            self.commit(&st, vec![Owned::Worker(record)])
        } else {
            Ticket::none()
        };
        st.announce(FarmEvent::Worker(worker.clone()));
        if before.is_some() && after.is_none() {
            st.schedule.wake_all();
        }
        drop(st);
        ticket.wait()
    }
}

/// The Blenders a worker offers, newest first: as it listed them, or the one
/// its version line and features describe (a worker that lists none). A
/// worker whose Blender version is unknown offers none that a version
/// requirement accepts.
fn runtimes(reg: &Registration) -> Vec<crate::model::runtime::Runtime> {
    let mut list = reg.runtimes.clone();
    if list.is_empty() {
        let version = crate::model::runtime::Version::parse(&reg.blender_version).unwrap_or(
            crate::model::runtime::Version {
                major: 0,
                minor: 0,
                patch: 0,
            },
        );
        list.push(crate::model::runtime::Runtime {
            version,
            kind: "blender".into(),
            path: String::new(),
            features: reg.features.clone(),
            devices: Vec::new(),
        });
    }
    list.sort_by_key(|r| std::cmp::Reverse(r.version));
    list.truncate(16);
    list
}
