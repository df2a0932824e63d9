//! A slot's ask for a task ahead, carried by the report of its previous
//! task: one call instead of two.
//!
//! When a render ends, the slot starts the task it holds ahead at once and
//! reports the finished one meanwhile; the new render then asks for the
//! slot's next task ahead (see [`super::ahead`]). Both calls go out at about
//! the same moment, so the ask rides on the report instead: the finished
//! task's Complete carries it (`CompleteRequest.next`) and its answer brings
//! the granted task back. An ask waits at most for that report's upload,
//! which the slot waits for anyway before it starts the task after next.
//!
//! A [`Carry`] is the slot's meeting point. The finisher of a task
//! [`Carry::open`]s it before the slot moves on; the next render's ask
//! finds it open and leaves its request there ([`Carry::ask`]); the report
//! [`Opened::take`]s the request into its Complete and answers it. A report
//! whose slot starts a task it held ahead waits a moment for that render's
//! ask ([`ASK_PATIENCE`]), as the two are made at about the same time. An
//! ask that finds no report on its way, or whose report could not carry it
//! (a failed render, a coordinator that predates the field, a Complete that
//! failed), is sent in a Lease call of its own, as before.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_proto as pb;
use tokio::sync::{oneshot, Notify};

/// How long a report waits for the ask of its slot's next render, when the
/// slot starts a task it held ahead: a warm session hands that render to
/// Blender within milliseconds; a cold one (another job's first task)
/// takes longer, and its ask then goes on its own. The result's
/// acknowledgement is delayed by at most this.
pub(super) const ASK_PATIENCE: Duration = Duration::from_millis(150);

/// The answer to a carried ask: the coordinator's, or `None` when the
/// report went without it or was not answered with one.
type Answer = Option<pb::LeaseResponse>;

/// Where a slot's ask meets the report of its previous task.
#[derive(Default)]
pub(super) struct Carry {
    meeting: Mutex<Meeting>,
    /// Woken when an ask is left.
    asked: Notify,
}

#[derive(Default)]
struct Meeting {
    /// Numbers the opened reports, so that an earlier one never takes or
    /// closes what a later one opened.
    opened: u64,
    /// The report that may carry an ask (its number), and the ask once
    /// made.
    open: Option<(u64, Option<Ask>)>,
}

/// A lease request waiting for its report, and where its answer goes.
struct Ask {
    request: pb::LeaseRequest,
    answer: oneshot::Sender<Answer>,
}

impl Carry {
    fn meeting(&self) -> std::sync::MutexGuard<'_, Meeting> {
        self.meeting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A report of the slot's finished task is on its way: the next ask
    /// may ride on it until it goes (or it ends without a Complete: then
    /// dropping the [`Opened`] sends the ask back to ask on its own).
    pub(super) fn open(self: &Arc<Self>) -> Opened {
        let mut m = self.meeting();
        m.opened += 1;
        // An ask left on an earlier report that never went: its asker asks
        // on its own (dropping the sender tells it so).
        m.open = Some((m.opened, None));
        Opened {
            carry: self.clone(),
            number: m.opened,
        }
    }

    /// Leaves `request` for the open report to carry; `None` when no report
    /// is on its way (or one already carries an ask): then the caller sends
    /// it itself. The receiver gives the answer, or `None` (or an error)
    /// when the report went without it.
    pub(super) fn ask(&self, request: pb::LeaseRequest) -> Option<oneshot::Receiver<Answer>> {
        let mut m = self.meeting();
        match &mut m.open {
            Some((_, slot @ None)) => {
                let (answer, answered) = oneshot::channel();
                *slot = Some(Ask { request, answer });
                self.asked.notify_waiters();
                Some(answered)
            }
            _ => None,
        }
    }
}

/// A report on its way, which may carry the slot's next ask. Dropping it
/// closes the meeting: an ask still waiting is told to go on its own.
pub(super) struct Opened {
    carry: Arc<Carry>,
    number: u64,
}

impl Opened {
    /// The ask to carry in the Complete about to be sent, if one is made
    /// within `patience`; closes the meeting (a later ask goes on its own).
    /// Answer it with [`Carried::answer`].
    pub(super) async fn take(&self, patience: Duration) -> Option<Carried> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let asked = self.carry.asked.notified();
            tokio::pin!(asked);
            asked.as_mut().enable();
            let late = tokio::time::Instant::now() >= deadline;
            {
                let mut m = self.carry.meeting();
                match &m.open {
                    Some((n, ask)) if *n == self.number && (ask.is_some() || late) => {
                        let (_, ask) = m.open.take().expect("open");
                        return ask.map(|a| Carried {
                            request: a.request,
                            answer: a.answer,
                        });
                    }
                    Some((n, None)) if *n == self.number => {}
                    // Closed, or a later report's.
                    _ => return None,
                }
            }
            let _ = tokio::time::timeout_at(deadline, asked).await;
        }
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        let mut m = self.carry.meeting();
        if matches!(m.open, Some((n, _)) if n == self.number) {
            m.open = None;
        }
    }
}

/// An ask taken into a Complete.
pub(super) struct Carried {
    /// What the Complete carries as `next`.
    pub(super) request: pb::LeaseRequest,
    answer: oneshot::Sender<Answer>,
}

impl Carried {
    /// Hands the Complete's answer to `next` to the asker (`None`: the
    /// Complete failed or the coordinator predates the field). Gives the
    /// answer back when the asker is gone: a task it grants must then be
    /// released.
    pub(super) fn answer(self, next: Answer) -> Answer {
        self.answer.send(next).err().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(slot: u32) -> pb::LeaseRequest {
        pb::LeaseRequest {
            slot,
            ahead: true,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_ask_rides_on_the_open_report_and_gets_its_answer() {
        let carry = Arc::new(Carry::default());
        assert!(carry.ask(request(0)).is_none(), "no report on its way");
        let opened = carry.open();
        let answered = carry.ask(request(3)).expect("the open report carries it");
        assert!(
            carry.ask(request(4)).is_none(),
            "one ask a report: a second goes on its own"
        );
        let carried = opened.take(Duration::ZERO).await.expect("the ask");
        assert_eq!(carried.request.slot, 3);
        assert!(opened.take(Duration::ZERO).await.is_none(), "taken once");
        assert!(carried.answer(Some(pb::LeaseResponse::default())).is_none());
        assert!(answered.await.unwrap().is_some());
        assert!(carry.ask(request(5)).is_none(), "the report went");
    }

    #[tokio::test]
    async fn a_report_that_ends_without_a_complete_sends_the_ask_back() {
        let carry = Arc::new(Carry::default());
        let opened = carry.open();
        let answered = carry.ask(request(0)).unwrap();
        drop(opened);
        assert!(answered.await.is_err(), "the asker asks on its own");
        assert!(carry.ask(request(0)).is_none());
    }

    #[tokio::test]
    async fn an_earlier_report_neither_takes_nor_closes_a_later_ones_ask() {
        let carry = Arc::new(Carry::default());
        let earlier = carry.open();
        let later = carry.open();
        let mut answered = carry.ask(request(1)).unwrap();
        assert!(earlier.take(Duration::ZERO).await.is_none());
        drop(earlier);
        assert!(
            matches!(
                answered.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            ),
            "still waiting on the later report"
        );
        let carried = later
            .take(Duration::ZERO)
            .await
            .expect("the later report carries it");
        carried.answer(None);
        assert_eq!(answered.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_report_waits_a_moment_for_the_ask_of_its_slots_next_render() {
        let carry = Arc::new(Carry::default());
        let opened = carry.open();
        let asker = {
            let carry = carry.clone();
            tokio::spawn(async move {
                tokio::time::sleep(ASK_PATIENCE / 3).await;
                carry.ask(request(7)).unwrap().await
            })
        };
        let carried = opened
            .take(ASK_PATIENCE)
            .await
            .expect("the ask came in time");
        assert_eq!(carried.request.slot, 7);
        carried.answer(None);
        assert_eq!(asker.await.unwrap().unwrap(), None);

        // No ask within the patience: the report goes alone, and closes
        // the meeting.
        let opened = carry.open();
        let start = tokio::time::Instant::now();
        assert!(opened.take(ASK_PATIENCE).await.is_none());
        assert!(start.elapsed() >= ASK_PATIENCE);
        assert!(carry.ask(request(8)).is_none());
    }

    #[tokio::test]
    async fn an_answer_nobody_waits_for_comes_back() {
        let carry = Arc::new(Carry::default());
        let opened = carry.open();
        drop(carry.ask(request(0)).unwrap());
        let granted = pb::LeaseResponse {
            task: Some(pb::TaskAssignment::default()),
            ..Default::default()
        };
        let back = opened
            .take(Duration::ZERO)
            .await
            .unwrap()
            .answer(Some(granted));
        assert!(back.and_then(|r| r.task).is_some(), "to be released");
    }
}
