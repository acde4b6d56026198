//! A store that stops a writer at a chosen call, to kill it there: every
//! call of the account-data writer's traits passes a [`Gate`] first (and
//! `next_ids` once more after the sequence answered), and the gate armed
//! for call `n` never lets that call through (the future
//! stays pending, as a process stopped dead leaves it). Included by path
//! by the tests that need it (`#[path = "common/kill_points.rs"] mod
//! kill_points;`), as `postgres.rs` is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use synapse_replication::positions::{AccountDataQuery, AccountDataRow, InvalidationRow};
use synapse_replication::transport::async_trait;
use synapse_replication::transport::postgres::{
    AccountDataTables, CachesStore, DatabaseStream, StreamIdStore,
};
use synapse_replication::wire::{InstanceName, Token};
use tokio::sync::Notify;

/// Counts the calls that pass, and stops the one it is armed for.
#[derive(Debug, Default)]
pub struct Gate {
    calls: AtomicUsize,
    /// The call (1-based) to stop; 0: none.
    stop_at: AtomicUsize,
    stopped: Notify,
    passed: Mutex<Vec<&'static str>>,
    /// Ids the sequence gave through this gate, by stream.
    taken: Mutex<Vec<(&'static str, Token)>>,
}

impl Gate {
    /// Stops the `n`-th call from now (1: the next).
    pub fn arm(&self, n: usize) {
        let now = self.calls.load(Ordering::SeqCst);
        self.stop_at.store(now + n, Ordering::SeqCst);
    }

    /// Waits until the armed call is stopped.
    pub async fn stopped(&self) {
        self.stopped.notified().await;
    }

    /// The calls that came, in order (the stopped one last).
    pub fn passed(&self) -> Vec<&'static str> {
        self.passed.lock().unwrap().clone()
    }

    /// The ids taken from the sequences through this gate.
    pub fn taken(&self) -> Vec<(&'static str, Token)> {
        self.taken.lock().unwrap().clone()
    }

    async fn pass(&self, call: &'static str) {
        self.passed.lock().unwrap().push(call);
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.stop_at.load(Ordering::SeqCst) {
            // notify_one keeps the wake-up for a waiter still to come.
            self.stopped.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

/// `inner`, each call of it through `gate` first.
pub struct Gated<T> {
    /// The store.
    pub inner: T,
    /// Its gate.
    pub gate: Arc<Gate>,
}

#[async_trait]
impl<T: StreamIdStore> StreamIdStore for Gated<T> {
    type Error = T::Error;

    async fn next_ids(&self, stream: &DatabaseStream, n: usize) -> Result<Vec<Token>, T::Error> {
        self.gate.pass("next_ids").await;
        let ids = self.inner.next_ids(stream, n).await?;
        self.gate
            .taken
            .lock()
            .unwrap()
            .extend(ids.iter().map(|&id| (stream.name, id)));
        // The sequence gave them; the writer has not heard yet.
        self.gate.pass("next_ids answered").await;
        Ok(ids)
    }

    async fn write_position(
        &self,
        stream: &DatabaseStream,
        instance: &InstanceName,
        position: Token,
    ) -> Result<(), T::Error> {
        self.gate.pass("write_position").await;
        self.inner.write_position(stream, instance, position).await
    }

    async fn delete_stale_positions(
        &self,
        stream: &DatabaseStream,
        writers: &[InstanceName],
    ) -> Result<(), T::Error> {
        self.gate.pass("delete_stale_positions").await;
        self.inner.delete_stale_positions(stream, writers).await
    }

    async fn positions(
        &self,
        stream: &DatabaseStream,
    ) -> Result<Vec<(InstanceName, Token)>, T::Error> {
        self.gate.pass("positions").await;
        self.inner.positions(stream).await
    }

    async fn last_value(&self, stream: &DatabaseStream) -> Result<Token, T::Error> {
        self.gate.pass("last_value").await;
        self.inner.last_value(stream).await
    }

    async fn max_id(&self, stream: &DatabaseStream) -> Result<Token, T::Error> {
        self.gate.pass("max_id").await;
        self.inner.max_id(stream).await
    }

    async fn rows_from(
        &self,
        stream: &DatabaseStream,
        from: Token,
    ) -> Result<Vec<(Option<InstanceName>, Token)>, T::Error> {
        self.gate.pass("rows_from").await;
        self.inner.rows_from(stream, from).await
    }
}

#[async_trait]
impl<T: CachesStore> CachesStore for Gated<T> {
    async fn insert_invalidations(
        &self,
        instance: &InstanceName,
        rows: &[InvalidationRow],
    ) -> Result<(), T::Error> {
        self.gate.pass("insert_invalidations").await;
        self.inner.insert_invalidations(instance, rows).await
    }

    async fn updated_caches(
        &self,
        instance: &InstanceName,
        from: Token,
        limit: usize,
    ) -> Result<Vec<InvalidationRow>, T::Error> {
        self.gate.pass("updated_caches").await;
        self.inner.updated_caches(instance, from, limit).await
    }
}

#[async_trait]
impl<T: AccountDataTables> AccountDataTables for Gated<T> {
    async fn upsert_global(
        &self,
        user_id: &str,
        data_type: &str,
        stream_id: Token,
        content: &str,
    ) -> Result<(), T::Error> {
        self.gate.pass("upsert_global").await;
        self.inner
            .upsert_global(user_id, data_type, stream_id, content)
            .await
    }

    async fn clear_global(
        &self,
        user_id: &str,
        data_type: &str,
        stream_id: Token,
    ) -> Result<u64, T::Error> {
        self.gate.pass("clear_global").await;
        self.inner.clear_global(user_id, data_type, stream_id).await
    }

    async fn upsert_room(
        &self,
        user_id: &str,
        room_id: &str,
        data_type: &str,
        stream_id: Token,
        content: &str,
    ) -> Result<(), T::Error> {
        self.gate.pass("upsert_room").await;
        self.inner
            .upsert_room(user_id, room_id, data_type, stream_id, content)
            .await
    }

    async fn clear_room(
        &self,
        user_id: &str,
        room_id: &str,
        data_type: &str,
        stream_id: Token,
    ) -> Result<u64, T::Error> {
        self.gate.pass("clear_room").await;
        self.inner
            .clear_room(user_id, room_id, data_type, stream_id)
            .await
    }

    async fn upsert_tag(
        &self,
        user_id: &str,
        room_id: &str,
        tag: &str,
        content: &str,
    ) -> Result<(), T::Error> {
        self.gate.pass("upsert_tag").await;
        self.inner.upsert_tag(user_id, room_id, tag, content).await
    }

    async fn delete_tag(&self, user_id: &str, room_id: &str, tag: &str) -> Result<(), T::Error> {
        self.gate.pass("delete_tag").await;
        self.inner.delete_tag(user_id, room_id, tag).await
    }

    async fn update_tag_revision(
        &self,
        user_id: &str,
        room_id: &str,
        stream_id: Token,
    ) -> Result<(), T::Error> {
        self.gate.pass("update_tag_revision").await;
        self.inner
            .update_tag_revision(user_id, room_id, stream_id)
            .await
    }

    async fn ignored_users(&self, user_id: &str) -> Result<Vec<String>, T::Error> {
        self.gate.pass("ignored_users").await;
        self.inner.ignored_users(user_id).await
    }

    async fn delete_ignored_users(
        &self,
        user_id: &str,
        ignored: Option<&[String]>,
    ) -> Result<(), T::Error> {
        self.gate.pass("delete_ignored_users").await;
        self.inner.delete_ignored_users(user_id, ignored).await
    }

    async fn insert_ignored_users(
        &self,
        user_id: &str,
        ignored: &[String],
    ) -> Result<(), T::Error> {
        self.gate.pass("insert_ignored_users").await;
        self.inner.insert_ignored_users(user_id, ignored).await
    }

    async fn updated_account_data(
        &self,
        query: &AccountDataQuery,
    ) -> Result<Vec<AccountDataRow>, T::Error> {
        self.gate.pass("updated_account_data").await;
        self.inner.updated_account_data(query).await
    }
}
