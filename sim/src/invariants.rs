//! The invariants of docs/PROTOCOL.md section 5, checked against what the embedded backend
//! really did (its history and queue logs), not against what actors were told; and the
//! entities' chains (each committed message's place in its entity's history) and the
//! publish order on FIFO destinations.

use std::collections::{BTreeMap, BTreeSet};

use futures::FutureExt;

use outbox::embedded::{EmbeddedBackend, SentMessage, StoreEvent, DEDUPLICATION_WINDOW};
use outbox::ports::{BusinessWrite, CommitRequest, ItemKey, Store};
use outbox::protocol::{
    DestinationName, OutboxRecord, OutboxState, OutgoingMessage, Position, TxnId, MESSAGE_ID_ATTRIBUTE,
    TXN_ID_ATTRIBUTE,
};
use outbox::request::{Settlement, TxnStatus};
use outbox::time::Timestamp;

use super::world::ApiResult;

/// The final state of a schedule.
#[derive(Debug)]
pub struct Observed {
    /// Commits that applied, by transaction.
    pub commits: BTreeMap<TxnId, CommitRequest>,
    /// Transactions that got a tombstone.
    pub tombstones: BTreeSet<TxnId>,
    /// Every message accepted by each destination, in order.
    pub published: BTreeMap<DestinationName, (bool, Vec<SentMessage>)>,
    /// Outbox records physically present at the end.
    pub records: Vec<OutboxRecord>,
    /// Business items at the end: version and count (an item deleted last is absent).
    pub items: BTreeMap<String, (u64, u64)>,
    /// The versions each item's committed writes stored, in the order they applied, one
    /// list per incarnation (a delete ends one, with the version it leaves the key at).
    pub incarnations: BTreeMap<String, Vec<Vec<u64>>>,
    /// Deletes applied (an item deleted and created again, entity mode).
    pub deletes: usize,
    /// How each API request ended.
    pub api_results: Vec<ApiResult>,
    /// Control messages left in the queue and its dead-letter queue.
    pub control_left: usize,
    /// Control messages sent (and accepted) per transaction: its first and every
    /// deferral, duplicates included.
    pub control_sent: BTreeMap<TxnId, usize>,
    /// The clock at the end.
    pub now: Timestamp,
    /// Entity mode: outbox entries (pending entries and fences) still in an item at the
    /// end, by item.
    pub entries_left: Vec<(ItemKey, OutboxRecord)>,
    /// Entity mode: transactions whose entry was removed from its item while no record of
    /// theirs was dispatched yet (the order a crash would turn into a lost side effect or
    /// a fence beside a commit).
    pub removed_before_record: Vec<TxnId>,
    /// Transactions that committed more than once (an entity commit applied twice).
    pub committed_twice: Vec<TxnId>,
    /// Entity mode, from the history: commits that were one conditional write of their
    /// item.
    pub entity_commits: usize,
    /// Entity mode: committed entries removed from their item after dispatch.
    pub entries_removed: usize,
    /// Entity mode: fences written (the mark raised or checked, with the tombstone record).
    pub fences: usize,
    /// Entity mode: entries settled into a sent mark (one write), among `entries_removed`.
    pub settled: usize,
    /// Entity mode: sent marks dropped from their item past their time.
    pub marks_forgotten: usize,
    /// Entity mode: sent marks dropped from their item before their time.
    pub evicted_before_record: Vec<TxnId>,
    /// What a status read (`GET /transactions/{id}`, given the item in entity mode) says at
    /// the end of each transaction that committed or was tombstoned.
    pub statuses: BTreeMap<TxnId, outbox::request::TxnStatus>,
    /// Every committed message placed in its entity's history, as the history says it
    /// committed, in commit order.
    pub placed: Vec<Placed>,
    /// Committed messages without a place, of transactions that changed one item (every
    /// transaction of the simulation that changes an item reads it through its staging
    /// first, so each of its messages must be placed): transaction and message id.
    pub unplaced: Vec<(TxnId, String)>,
}

/// A committed message placed in its entity's history.
#[derive(Debug, Clone)]
pub struct Placed {
    /// Its transaction.
    pub txn_id: TxnId,
    /// Its id.
    pub id: String,
    /// Where it was sent.
    pub destination: DestinationName,
    /// Its place, as committed.
    pub position: Position,
    /// The version the commit left the entity at, as the history says (`None`: the
    /// commit did not write the entity).
    pub committed_version: Option<u64>,
    /// Committed in entity form: one conditional write of the entity, the transaction's
    /// entry inside it (what the publishers' commit order covers).
    pub entity_form: bool,
    /// The commit's place in the history.
    pub commit: usize,
}

/// The messages of a commit (`commit`, the history's `index`-th event) as placed, and those
/// left unplaced although the commit changed one item.
#[allow(clippy::too_many_arguments)]
fn place(
    messages: &[OutgoingMessage],
    txn_id: TxnId,
    index: usize,
    entity_form: bool,
    changed: &[&ItemKey],
    version_of: impl Fn(&ItemKey) -> Option<u64>,
    placed: &mut Vec<Placed>,
    unplaced: &mut Vec<(TxnId, String)>,
) {
    for message in messages {
        match &message.position {
            Some(position) => placed.push(Placed {
                txn_id,
                id: message.id.as_str().to_owned(),
                destination: message.destination.clone(),
                position: position.clone(),
                committed_version: version_of(&position.entity),
                entity_form,
                commit: index,
            }),
            None if changed.len() == 1 => unplaced.push((txn_id, message.id.as_str().to_owned())),
            None => {}
        }
    }
}

/// Records `version` as stored by a write of `key`, in its current incarnation.
fn stored(incarnations: &mut BTreeMap<String, Vec<Vec<u64>>>, key: String, version: u64) {
    let lives = incarnations.entry(key).or_insert_with(|| vec![Vec::new()]);
    lives.last_mut().expect("one at least").push(version);
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant (`I1` to `I7`, `business`, `idempotency`, `chain`, `publish order`).
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} violated: {}", self.invariant, self.detail)
    }
}

impl Observed {
    /// Reads the final state out of `backend`.
    pub fn capture(backend: &EmbeddedBackend, now: Timestamp, api_results: Vec<ApiResult>) -> Self {
        let mut commits = BTreeMap::new();
        let mut tombstones = BTreeSet::new();
        let mut items: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut incarnations: BTreeMap<String, Vec<Vec<u64>>> = BTreeMap::new();
        let mut deletes = 0;
        let mut dispatched: BTreeSet<TxnId> = BTreeSet::new();
        let mut removed_before_record = Vec::new();
        let mut committed_twice = Vec::new();
        let (mut entity_commits, mut entries_removed, mut fences) = (0, 0, 0);
        let mut marks_forgotten = 0;
        let mut settled: BTreeSet<TxnId> = BTreeSet::new();
        let mut evicted_before_record = Vec::new();
        let mut entity_keys: BTreeMap<TxnId, ItemKey> = BTreeMap::new();
        let (mut placed, mut unplaced) = (Vec::new(), Vec::new());
        for (index, event) in backend.store.history().into_iter().enumerate() {
            match event {
                StoreEvent::Committed { request, versions, .. } => {
                    let changed: Vec<&ItemKey> = request
                        .writes
                        .iter()
                        .filter(|write| !matches!(write, BusinessWrite::Check { .. }))
                        .map(BusinessWrite::key)
                        .collect();
                    place(
                        &request.outbox.messages,
                        request.txn_id,
                        index,
                        false,
                        &changed,
                        |key| versions.get(key).copied(),
                        &mut placed,
                        &mut unplaced,
                    );
                    for write in &request.writes {
                        match write {
                            BusinessWrite::Put { key, data, .. } => {
                                let count = data["count"].as_u64().unwrap_or(0);
                                let version = versions[key];
                                items.insert(key.to_string(), (version, count));
                                stored(&mut incarnations, key.to_string(), version);
                            }
                            BusinessWrite::Delete { key, .. } => {
                                deletes += 1;
                                items.remove(key.as_str());
                                // The delete's version ends this life; the next continues.
                                stored(&mut incarnations, key.to_string(), versions[key]);
                                incarnations.entry(key.to_string()).or_default().push(Vec::new());
                            }
                            BusinessWrite::Check { .. } => {}
                        }
                    }
                    let txn_id = request.txn_id;
                    if commits.insert(txn_id, *request).is_some() {
                        committed_twice.push(txn_id);
                    }
                }
                StoreEvent::Tombstoned { txn_id, .. } => {
                    tombstones.insert(txn_id);
                }
                // Entity mode: the one conditional write is the transaction's commit, its
                // entry its record.
                StoreEvent::EntityCommitted { commit, version, .. } => {
                    entity_commits += 1;
                    place(
                        &commit.entry.messages,
                        commit.entry.txn_id,
                        index,
                        true,
                        &[&commit.key],
                        |key| (*key == commit.key).then_some(version),
                        &mut placed,
                        &mut unplaced,
                    );
                    entity_keys.insert(commit.entry.txn_id, commit.key.clone());
                    let count = commit.data["count"].as_u64().unwrap_or(0);
                    items.insert(commit.key.to_string(), (version, count));
                    stored(&mut incarnations, commit.key.to_string(), version);
                    let request = CommitRequest {
                        txn_id: commit.entry.txn_id,
                        writes: vec![BusinessWrite::Put {
                            key: commit.key,
                            data: commit.data,
                            expected: commit.expected,
                        }],
                        outbox: commit.entry,
                        idempotency: None,
                    };
                    let txn_id = request.txn_id;
                    if commits.insert(txn_id, request).is_some() {
                        committed_twice.push(txn_id);
                    }
                }
                StoreEvent::MarkedDispatched { txn_id, .. } => {
                    dispatched.insert(txn_id);
                }
                StoreEvent::Fenced { key, txn_id, .. } => {
                    fences += 1;
                    entity_keys.insert(txn_id, key);
                }
                // A committed transaction's entry leaves its item only once its record
                // is dispatched (only committed transactions have entries).
                // One write: the entry leaves and its sent mark, the proof, stays.
                StoreEvent::EntrySettled { txn_id, .. } => {
                    entries_removed += 1;
                    settled.insert(txn_id);
                }
                // A sent mark leaves its item only past its time (forgotten, as an expired
                // record is) or with a delete that puts its record.
                StoreEvent::MarksForgotten { forgotten, at, .. } => {
                    marks_forgotten += forgotten.len();
                    evicted_before_record.extend(
                        forgotten
                            .into_iter()
                            .filter(|(_, until)| *until > at)
                            .map(|(txn_id, _)| txn_id),
                    );
                }
                // A consumer's position kept alone: no record, entry or business change.
                StoreEvent::AppliedKept { .. } => {}
                StoreEvent::EntryRemoved { txn_id, .. } => {
                    if dispatched.contains(&txn_id) {
                        entries_removed += 1;
                    } else {
                        removed_before_record.push(txn_id);
                    }
                }
            }
        }
        let statuses = commits
            .keys()
            .chain(tombstones.iter())
            .map(|txn_id| {
                let status = TxnStatus::read(backend.store.as_ref(), *txn_id, entity_keys.get(txn_id))
                    .now_or_never()
                    .expect("the embedded store answers at once")
                    .expect("the embedded store reads");
                (*txn_id, status)
            })
            .collect();
        let entries_left = items
            .keys()
            .filter_map(|key| key.parse::<ItemKey>().ok())
            .filter_map(|key| {
                let entity = Store::get_entity(backend.store.as_ref(), &key)
                    .now_or_never()
                    .expect("the embedded store answers at once")
                    .ok()
                    .flatten()?;
                Some(entity.entries.into_values().map(move |entry| (key.clone(), entry)))
            })
            .flatten()
            .collect();
        let published = backend
            .publisher
            .destinations()
            .iter()
            .map(|(name, queue)| (name.clone(), (queue.config().fifo, queue.sent())))
            .collect();
        let control = backend.control_queue.queue();
        let control_left = control.len() + control.dead_letter_queue().map_or(0, |dlq| dlq.len());
        let mut control_sent: BTreeMap<TxnId, usize> = BTreeMap::new();
        for sent in control.sent() {
            if let Ok(message) = outbox::protocol::ControlMessage::decode(&sent.request.body) {
                *control_sent.entry(message.txn_id).or_default() += 1;
            }
        }
        Self {
            commits,
            tombstones,
            published,
            records: backend.store.outbox_records(),
            items,
            incarnations,
            deletes,
            api_results,
            control_left,
            control_sent,
            now,
            entries_left,
            removed_before_record,
            committed_twice,
            entity_commits,
            entries_removed,
            fences,
            settled: settled.len(),
            marks_forgotten,
            evicted_before_record,
            statuses,
            placed,
            unplaced,
        }
    }

    /// Checks every invariant; returns the first violation.
    pub fn check(&self) -> Result<(), Violation> {
        self.no_lost_side_effect()?;
        self.no_phantom_side_effect()?;
        self.tombstones_are_final()?;
        self.stable_identity()?;
        self.bounded_growth()?;
        self.truthful_answers()?;
        self.business_state()?;
        self.idempotency_once()?;
        self.entities()?;
        self.chains()?;
        self.fifo_publish_order()
    }

    /// The chain: every committed message of a transaction that changed one item it read
    /// is placed; per entity and destination the places of the committed messages are
    /// seq 1, 2, ..., n, each once (no gap; no fork: no two commits hold one seq), in the
    /// order the history committed them; each `version` is the entity's version after its
    /// commit, as the history says (so versions increase with seq, one transaction's
    /// messages sharing its version), across deletes and re-creates; each `after` is the
    /// version of the previous seq's transaction (0 before the first), the previous
    /// transaction's where one transaction sent several.
    fn chains(&self) -> Result<(), Violation> {
        let fail = |detail: String| {
            Err(Violation {
                invariant: "chain",
                detail,
            })
        };
        if let Some((txn_id, id)) = self.unplaced.first() {
            return fail(format!(
                "message {id} of committed transaction {txn_id}, which changed one item it read, has no place in its history"
            ));
        }
        let mut chains: BTreeMap<(&ItemKey, &DestinationName), Vec<&Placed>> = BTreeMap::new();
        for placed in &self.placed {
            if placed.position.chain != placed.destination {
                return fail(format!(
                    "message {} went to {} but is placed in the chain of {}",
                    placed.id, placed.destination, placed.position.chain
                ));
            }
            chains
                .entry((&placed.position.entity, &placed.position.chain))
                .or_default()
                .push(placed);
        }
        for ((entity, chain), mut links) in chains {
            let name = format!("{entity} on {chain}");
            links.sort_by_key(|link| (link.position.seq, link.commit));
            for (index, link) in links.iter().enumerate() {
                let seq = index as u64 + 1;
                let previous = index.checked_sub(1).map(|before| links[before]);
                if link.position.seq < seq {
                    let other = previous.expect("a seq below 1 is never read");
                    return fail(format!(
                        "{name}: a fork: seq {} is held by message {} of {} and by message {} of {}",
                        link.position.seq, other.id, other.txn_id, link.id, link.txn_id
                    ));
                }
                if link.position.seq > seq {
                    return fail(format!(
                        "{name}: a gap: no committed message holds seq {seq} (the next is {}, message {} of {})",
                        link.position.seq, link.id, link.txn_id
                    ));
                }
                match link.committed_version {
                    Some(version) if version == link.position.version => {}
                    committed => {
                        return fail(format!(
                            "{name}: seq {seq} (message {} of {}) says version {}, its commit left {entity} at {committed:?}",
                            link.id, link.txn_id, link.position.version
                        ))
                    }
                }
                let after = match previous {
                    None => 0,
                    Some(before) if before.txn_id == link.txn_id => before.position.after,
                    Some(before) => before.position.version,
                };
                if link.position.after != after {
                    return fail(format!(
                        "{name}: seq {seq} (message {} of {}) says after {}, the version of the previous seq's transaction is {after}",
                        link.id, link.txn_id, link.position.after
                    ));
                }
                if let Some(before) = previous {
                    let increases = if before.txn_id == link.txn_id {
                        before.position.version == link.position.version
                    } else {
                        before.position.version < link.position.version && before.commit < link.commit
                    };
                    if !increases {
                        return fail(format!(
                            "{name}: seq {} (version {}, commit #{}) comes before seq {seq} (version {}, commit #{}) in the chain but not in the history",
                            before.position.seq, before.position.version, before.commit, link.position.version, link.commit
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Publish order: on a FIFO destination, the first delivery of each entity's messages
    /// comes in seq order (later copies may follow, whether the deduplication window
    /// dropped them or not: first deliveries only), whichever form each was committed in
    /// (an entry in the entity, or a record beside it that the chain names).
    fn fifo_publish_order(&self) -> Result<(), Violation> {
        let by_id: BTreeMap<&str, &Placed> = self.placed.iter().map(|placed| (placed.id.as_str(), placed)).collect();
        for (destination, (fifo, sent)) in &self.published {
            if !fifo {
                continue;
            }
            let mut seen: BTreeSet<&str> = BTreeSet::new();
            let mut last: BTreeMap<&ItemKey, &Placed> = BTreeMap::new();
            for copy in sent.iter().filter(|copy| !copy.deduplicated) {
                let Some(id) = copy.request.attributes.get(MESSAGE_ID_ATTRIBUTE) else {
                    continue;
                };
                if !seen.insert(id.as_str()) {
                    continue;
                }
                let Some(placed) = by_id.get(id.as_str()) else {
                    continue;
                };
                let entity = &placed.position.entity;
                if let Some(before) = last
                    .get(entity)
                    .filter(|before| before.position.seq > placed.position.seq)
                {
                    return Err(Violation {
                        invariant: "publish order",
                        detail: format!(
                            "on FIFO destination {destination}, message {} of {} (seq {} of {entity}) was first delivered after message {} of {} (seq {})",
                            placed.id, placed.txn_id, placed.position.seq, before.id, before.txn_id, before.position.seq
                        ),
                    });
                }
                last.insert(entity, placed);
            }
        }
        Ok(())
    }

    /// Entity mode: no transaction committed twice; no committed transaction's entry left
    /// its item before its record was dispatched; and after recovery no item holds an
    /// entry: every pending one was dispatched and removed (I1), every fence pruned (I6).
    fn entities(&self) -> Result<(), Violation> {
        if let Some(txn_id) = self.committed_twice.first() {
            return Err(Violation {
                invariant: "business state",
                detail: format!("transaction {txn_id} committed twice"),
            });
        }
        if let Some(txn_id) = self.evicted_before_record.first() {
            return Err(Violation {
                invariant: "I3 tombstones are final",
                detail: format!("the sent mark of committed transaction {txn_id} left its item before its time"),
            });
        }
        if let Some(txn_id) = self.removed_before_record.first() {
            return Err(Violation {
                invariant: "I1 no lost side effect",
                detail: format!(
                    "the entry of committed transaction {txn_id} left its item before its record was dispatched"
                ),
            });
        }
        match self.entries_left.first() {
            Some((key, entry)) => Err(Violation {
                invariant: "I1 no lost side effect",
                detail: format!(
                    "the {} entry of {} is still in {key} after recovery",
                    entry.state.as_str(),
                    entry.txn_id
                ),
            }),
            None => Ok(()),
        }
    }

    fn sent_ids(&self) -> BTreeMap<String, Vec<(&DestinationName, bool, &SentMessage)>> {
        let mut ids: BTreeMap<String, Vec<(&DestinationName, bool, &SentMessage)>> = BTreeMap::new();
        for (destination, (fifo, sent)) in &self.published {
            for message in sent {
                let id = message
                    .request
                    .attributes
                    .get(MESSAGE_ID_ATTRIBUTE)
                    .cloned()
                    .unwrap_or_default();
                ids.entry(id).or_default().push((destination, *fifo, message));
            }
        }
        ids
    }

    /// I1: every committed message reached its destination, nothing is left pending and
    /// no control message is left over.
    fn no_lost_side_effect(&self) -> Result<(), Violation> {
        let fail = |detail: String| {
            Err(Violation {
                invariant: "I1 no lost side effect",
                detail,
            })
        };
        let sent = self.sent_ids();
        for (txn_id, request) in &self.commits {
            for message in &request.outbox.messages {
                let delivered = sent.get(message.id.as_str()).is_some_and(|copies| {
                    copies
                        .iter()
                        .any(|(destination, _, copy)| **destination == message.destination && !copy.deduplicated)
                });
                if !delivered {
                    return fail(format!(
                        "message {} of committed transaction {txn_id} was never published",
                        message.id
                    ));
                }
            }
        }
        if let Some(record) = self.records.iter().find(|record| record.state == OutboxState::Pending) {
            return fail(format!("transaction {} is still pending after recovery", record.txn_id));
        }
        if self.control_left > 0 {
            return fail(format!("{} control messages left after recovery", self.control_left));
        }
        Ok(())
    }

    /// I2: everything published belongs to a committed transaction, exactly as committed.
    fn no_phantom_side_effect(&self) -> Result<(), Violation> {
        let fail = |detail: String| {
            Err(Violation {
                invariant: "I2 no phantom side effect",
                detail,
            })
        };
        for (id, copies) in self.sent_ids() {
            for (destination, _, copy) in copies {
                let txn = copy
                    .request
                    .attributes
                    .get(TXN_ID_ATTRIBUTE)
                    .and_then(|text| text.parse::<TxnId>().ok());
                let Some(request) = txn.and_then(|txn| self.commits.get(&txn)) else {
                    return fail(format!(
                        "message {id:?} was published for a transaction that never committed"
                    ));
                };
                let committed = request.outbox.messages.iter().find(|message| message.id.as_str() == id);
                match committed {
                    Some(message) if message.body == copy.request.body && message.destination == *destination => {}
                    _ => {
                        return fail(format!(
                            "message {id:?} on {destination} differs from what was committed"
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// I3: no transaction both committed and got a tombstone.
    fn tombstones_are_final(&self) -> Result<(), Violation> {
        match self.commits.keys().find(|txn| self.tombstones.contains(txn)) {
            Some(txn) => Err(Violation {
                invariant: "I3 tombstones are final",
                detail: format!("transaction {txn} committed and was tombstoned"),
            }),
            None => Ok(()),
        }
    }

    /// I4: every copy of a message carries the same content; a FIFO destination never
    /// enqueued one id twice within its deduplication window.
    fn stable_identity(&self) -> Result<(), Violation> {
        let fail = |detail: String| {
            Err(Violation {
                invariant: "I4 stable identity",
                detail,
            })
        };
        for (id, copies) in self.sent_ids() {
            let (_, _, first) = copies[0];
            if copies.iter().any(|(_, _, copy)| {
                copy.request.body != first.request.body || copy.request.attributes != first.request.attributes
            }) {
                return fail(format!("copies of message {id:?} differ"));
            }
            let enqueued: Vec<Timestamp> = copies
                .iter()
                .filter(|(_, fifo, copy)| *fifo && !copy.deduplicated)
                .map(|(_, _, copy)| copy.sent_at)
                .collect();
            if enqueued
                .windows(2)
                .any(|pair| pair[1].since(pair[0]) < DEDUPLICATION_WINDOW)
            {
                return fail(format!(
                    "FIFO destination enqueued message {id:?} twice within the deduplication window"
                ));
            }
        }
        Ok(())
    }

    /// I6: every record that is not pending expires.
    fn bounded_growth(&self) -> Result<(), Violation> {
        match self
            .records
            .iter()
            .find(|record| record.state != OutboxState::Pending && record.expires_at.is_none())
        {
            Some(record) => Err(Violation {
                invariant: "I6 bounded growth",
                detail: format!("record of {} never expires", record.txn_id),
            }),
            None => Ok(()),
        }
    }

    /// I7: success only for committed transactions, definite failure only for
    /// uncommitted ones.
    fn truthful_answers(&self) -> Result<(), Violation> {
        let fail = |detail: String| {
            Err(Violation {
                invariant: "I7 truthful answers",
                detail,
            })
        };
        // What a status read says at the end: a committed transaction is pending or
        // dispatched, one that never committed is never either (entity mode reads the
        // item: its entry, or its sent mark, once its record is no longer written).
        for (txn_id, status) in &self.statuses {
            let committed = self.commits.contains_key(txn_id);
            let told = matches!(status, TxnStatus::Pending | TxnStatus::Dispatched);
            if committed != told {
                return fail(format!(
                    "a status read of {txn_id} says {} at the end; it {}",
                    status.as_str(),
                    if committed { "committed" } else { "never committed" }
                ));
            }
        }
        for (index, result) in self.api_results.iter().enumerate() {
            match result {
                ApiResult::Answered(Ok(committed)) => match self.commits.get(&committed.txn_id) {
                    None => {
                        return fail(format!(
                            "request {index} was told {} committed; it did not",
                            committed.txn_id
                        ))
                    }
                    Some(request) => {
                        let ids: Vec<_> = request.outbox.messages.iter().map(|m| m.id.clone()).collect();
                        if ids != committed.message_ids {
                            return fail(format!(
                                "request {index} was told other message ids than were committed"
                            ));
                        }
                    }
                },
                ApiResult::Answered(Err(error))
                    if error.is_definite() && self.commits.contains_key(&error.txn_id()) =>
                {
                    return fail(format!(
                        "request {index} was told {error}; transaction {} committed",
                        error.txn_id()
                    ));
                }
                // An abandon's settlement is a claim: never committed (a tombstone), or
                // committed (a commit of it, handed to a task, landed first); left to the
                // worker claims nothing.
                ApiResult::Abandoned { txn_id, settlement } => {
                    let committed = self.commits.contains_key(txn_id);
                    if settlement.never_committed() && committed {
                        return fail(format!(
                            "request {index} abandoned {txn_id}, told {}, yet it committed",
                            settlement.as_str()
                        ));
                    }
                    if matches!(settlement, Settlement::Committed(_)) && !committed {
                        return fail(format!(
                            "request {index} abandoned {txn_id} and was told it committed; it did not"
                        ));
                    }
                    if *settlement == Settlement::Tombstoned && !self.tombstones.contains(txn_id) {
                        return fail(format!(
                            "request {index} was told {txn_id} was tombstoned; no tombstone was written"
                        ));
                    }
                }
                ApiResult::Http {
                    status,
                    named,
                    unknown,
                    began,
                    ..
                } => {
                    // Once a transaction began, every answer names it.
                    if began.is_some() && named != began {
                        return fail(format!(
                            "request {index} began {began:?} and was answered {status} naming {named:?}"
                        ));
                    }
                    let committed = named.is_some_and(|txn| self.commits.contains_key(&txn));
                    if result.claims_committed() && !committed {
                        return fail(format!(
                            "request {index} was answered {status} for {named:?}, which did not commit"
                        ));
                    }
                    if !result.claims_committed() && !unknown && committed {
                        return fail(format!(
                            "request {index} was answered {status} (a definite failure) for {named:?}, which committed"
                        ));
                    }
                }
                ApiResult::Answered(Err(_)) | ApiResult::Crashed => {}
            }
        }
        Ok(())
    }

    /// No lost or doubled update: each counter's count equals the number of committed
    /// transactions that wrote it in its life; and a key's versions never restart: each
    /// write (a delete included) stores the version after the last one the key held, in
    /// every life, so that the versions of all its lives together are 1, 2, 3, ...
    fn business_state(&self) -> Result<(), Violation> {
        for (key, lives) in &self.incarnations {
            let fail = |detail: String| {
                Err(Violation {
                    invariant: "business state",
                    detail: format!("{key}: {detail}"),
                })
            };
            // In the order they applied, across lives.
            let all: Vec<u64> = lives.iter().flatten().copied().collect();
            let expected: Vec<u64> = (1..=all.len() as u64).collect();
            if all != expected {
                return fail(format!(
                    "versions across its lives, in the order they applied: {lives:?}"
                ));
            }
            let last = lives.last().map_or(0, Vec::len) as u64;
            let last_version = all.last().copied().unwrap_or(0);
            match self.items.get(key) {
                Some(&(version, count)) if version != last_version || count != last => {
                    return fail(format!(
                    "final version {version} (of {last_version}), count {count}, after {last} writes in its last life"
                ))
                }
                None if last > 0 => return fail("deleted last, yet written after".into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// One idempotency key, at most one committed transaction.
    fn idempotency_once(&self) -> Result<(), Violation> {
        let mut seen = BTreeSet::new();
        for request in self.commits.values() {
            if let Some(record) = &request.idempotency {
                if !seen.insert(record.slot.clone()) {
                    return Err(Violation {
                        invariant: "idempotency",
                        detail: format!("key {} committed twice", record.slot),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The items a schedule's requests touch, for tests that want to read them.
pub fn counter_key(index: usize) -> ItemKey {
    format!("COUNTER#{index}").parse().expect("valid key")
}
