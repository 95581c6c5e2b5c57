//! Checks after every step of a schedule ([`super::SimConfig::step_checks`]): safety
//! properties that hold at every reachable state, read incrementally from the embedded
//! backend's history and destination logs (each step reads only what was added since the
//! last).
//!
//! What a final-state check cannot see is an order: a message a destination accepted
//! while its transaction had not committed (yet), which a commit landing later would hide
//! from the check at the end. The others are checked at the step they break for the
//! step number in the counterexample (a key's versions, across its lives, only go up; no
//! transaction both committed and tombstoned).

use std::collections::{BTreeMap, BTreeSet};

use outbox::embedded::{EmbeddedBackend, StoreEvent};
use outbox::protocol::{TxnId, TXN_ID_ATTRIBUTE};

/// What the checks have read so far.
#[derive(Debug, Default)]
pub(crate) struct StepChecks {
    /// History events read.
    events: usize,
    /// Copies read, per destination.
    copies: BTreeMap<String, usize>,
    /// Transactions committed so far.
    committed: BTreeSet<TxnId>,
    /// Transactions tombstoned so far.
    tombstoned: BTreeSet<TxnId>,
    /// The last version each key stored (a delete's included).
    versions: BTreeMap<String, u64>,
    /// Steps checked.
    pub steps: usize,
}

impl StepChecks {
    /// Reads what `backend` did since the last call; the first broken property, if any.
    pub fn after_step(&mut self, backend: &EmbeddedBackend) -> Result<(), String> {
        self.steps += 1;
        let history = backend.store.history();
        for event in history.iter().skip(self.events) {
            let mut stored = |key: String, version: u64| match self.versions.insert(key.clone(), version) {
                Some(before) if before >= version => Err(format!(
                    "versions of {key} restarted or went back: it stored version {version} after {before}"
                )),
                _ => Ok(()),
            };
            let txn_id = match event {
                StoreEvent::Committed { request, versions, .. } => {
                    for (key, version) in versions {
                        stored(key.to_string(), *version)?;
                    }
                    Some(request.txn_id)
                }
                StoreEvent::EntityCommitted { commit, version, .. } => {
                    stored(commit.key.to_string(), *version)?;
                    Some(commit.entry.txn_id)
                }
                StoreEvent::Tombstoned { txn_id, .. } => {
                    self.tombstoned.insert(*txn_id);
                    if self.committed.contains(txn_id) {
                        return Err(format!("transaction {txn_id} was tombstoned after it committed"));
                    }
                    None
                }
                _ => None,
            };
            if let Some(txn_id) = txn_id {
                self.committed.insert(txn_id);
                if self.tombstoned.contains(&txn_id) {
                    return Err(format!("transaction {txn_id} committed after it was tombstoned"));
                }
            }
        }
        self.events = history.len();
        for (name, queue) in backend.publisher.destinations() {
            let sent = queue.sent();
            let read = self.copies.entry(name.to_string()).or_default();
            for copy in sent.iter().skip(*read) {
                let txn = copy
                    .request
                    .attributes
                    .get(TXN_ID_ATTRIBUTE)
                    .and_then(|text| text.parse::<TxnId>().ok());
                if !txn.is_some_and(|txn| self.committed.contains(&txn)) {
                    return Err(format!(
                        "{name} accepted a message of transaction {} before it committed",
                        txn.map_or_else(|| "(unnamed)".to_owned(), |txn| txn.to_string())
                    ));
                }
            }
            *read = sent.len();
        }
        Ok(())
    }
}
