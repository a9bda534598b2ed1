//! Pull plans: a set of blocks (a stage's layers, the lm_head) pulled in
//! one parallel schedule, in the order they are first used, with bounded
//! memory in flight. Items are handed out in plan order as each is
//! verified, so a consumer can start on the first layer while later ones
//! are still arriving.
//!
//! The schedule starts the items of more than one part first (see
//! [`start_large_first`]), then each other item's pull in plan order once
//! the memory budget has room for it; every part of every item goes
//! through the store's one gate of parts in flight, which serves them first
//! come first served, so the earliest items get the link first. An item's
//! bytes count against the budget until the consumer takes it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use gkq_format::Block;
use gkq_store::RangeRead;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::error::{ReaderError, Result};
use crate::inner::Inner;
use crate::lmhead::Matrix;

/// Memory a pull may hold in flight by default: 1 GiB.
pub const DEFAULT_PULL_BUDGET: u64 = 1 << 30;

/// One thing to pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullItem {
    /// A block's values (dense bytes in its dtype; spectral reconstructed).
    Block(String),
    /// The lm_head, made resident (from its narrowest exact source).
    LmHead,
}

/// What to pull, in the order of first use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullPlan {
    items: Vec<PullItem>,
    budget: u64,
}

impl Default for PullPlan {
    fn default() -> Self {
        PullPlan {
            items: Vec::new(),
            budget: DEFAULT_PULL_BUDGET,
        }
    }
}

impl PullPlan {
    /// An empty plan with the default budget.
    pub fn new() -> PullPlan {
        PullPlan::default()
    }

    /// Adds a block.
    pub fn block(mut self, name: impl Into<String>) -> PullPlan {
        self.items.push(PullItem::Block(name.into()));
        self
    }

    /// Adds the lm_head.
    pub fn lm_head(mut self) -> PullPlan {
        self.items.push(PullItem::LmHead);
        self
    }

    /// Sets the memory budget: bytes pulled but not yet taken, plus bytes in flight.
    pub fn budget(mut self, bytes: u64) -> PullPlan {
        self.budget = bytes.max(1);
        self
    }

    /// The items, in order.
    pub fn items(&self) -> &[PullItem] {
        &self.items
    }
}

/// A pulled item.
#[derive(Debug)]
pub enum Pulled {
    /// A block's values.
    Block {
        /// The block (alias followed).
        block: Block,
        /// Its values as dense bytes in its dtype, verified.
        bytes: Bytes,
    },
    /// The resident lm_head.
    LmHead(Arc<Matrix>),
}

/// A task aborted when its handle is dropped.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Future for AbortOnDrop<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

type Started = (PullItem, AbortOnDrop<Result<Pulled>>, OwnedSemaphorePermit);

/// A running pull: take its items in plan order with [`Pull::next`].
/// Dropping it cancels what has not been taken.
pub struct Pull {
    rx: mpsc::UnboundedReceiver<Started>,
    _schedule: AbortOnDrop<()>,
}

impl std::fmt::Debug for Pull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pull").finish_non_exhaustive()
    }
}

/// MiB units of the budget semaphore.
const UNIT: u64 = 1 << 20;

async fn pull_item(inner: Arc<Inner>, item: PullItem) -> Result<Pulled> {
    let len = item_len(&inner, &item);
    let pulled = match item {
        PullItem::Block(name) => {
            let (block, bytes) = inner.block_values(&name).await?;
            Pulled::Block { block, bytes }
        }
        PullItem::LmHead => Pulled::LmHead(inner.lm_head_matrix().await?),
    };
    if let Some(p) = &inner.config.progress {
        p.0.advance(len);
    }
    Ok(pulled)
}

fn item_len(inner: &Inner, item: &PullItem) -> u64 {
    match item {
        PullItem::Block(name) => inner.payload_len(name),
        PullItem::LmHead => inner.lm_head_len(),
    }
}

/// The budget units an item of `len` bytes holds: at least one, at most
/// the whole budget.
fn units_of(len: u64, units: usize) -> u64 {
    len.div_ceil(UNIT).clamp(1, units as u64)
}

/// A started item's task and its share of the budget.
type Task = (AbortOnDrop<Result<Pulled>>, OwnedSemaphorePermit);

/// Starts the items of more than one part before the rest: each part is
/// one response, which object stores cap and which starts slowly, so in
/// plan order such an item (the lm_head) would end a pull nearly alone on
/// the link, while small items (one request each) fill the link around
/// it when it starts first. Only over the network (from local files,
/// the order changes nothing but the memory held at once: 9 MB more peak
/// RSS for SmolLM2), and only while the budget keeps room for the largest
/// item, so that the items before them in plan order can always start;
/// items are still handed out in plan order.
fn start_large_first(
    inner: &Arc<Inner>,
    items: &[PullItem],
    budget: &Arc<Semaphore>,
    units: usize,
) -> std::collections::HashMap<usize, Task> {
    if !inner.knot.is_remote() {
        return std::collections::HashMap::new();
    }
    let part = inner.store.gate().config().part_size.max(1);
    let lens: Vec<u64> = items.iter().map(|i| item_len(inner, i)).collect();
    let need = |len: u64| units_of(len, units);
    let reserve = lens.iter().map(|&l| need(l)).max().unwrap_or(0);
    let mut left = (units as u64).saturating_sub(reserve);
    let mut early = std::collections::HashMap::new();
    for (i, (item, &len)) in items.iter().zip(&lens).enumerate() {
        if len <= part || need(len) > left {
            continue;
        }
        let n = u32::try_from(need(len)).unwrap_or(u32::MAX);
        let Ok(permit) = budget.clone().try_acquire_many_owned(n) else {
            break;
        };
        left -= need(len);
        let task = AbortOnDrop(tokio::spawn(pull_item(inner.clone(), item.clone())));
        early.insert(i, (task, permit));
    }
    early
}

impl Pull {
    /// Starts `plan` on the current runtime.
    pub(crate) fn start(inner: Arc<Inner>, plan: PullPlan) -> Pull {
        let (tx, rx) = mpsc::unbounded_channel();
        let units = usize::try_from(plan.budget.div_ceil(UNIT).max(1)).unwrap_or(usize::MAX >> 4);
        if let Some(p) = &inner.config.progress {
            p.0.start(plan.items.iter().map(|i| item_len(&inner, i)).sum());
        }
        let schedule = tokio::spawn(async move {
            let budget = Arc::new(Semaphore::new(units));
            let need = |item: &PullItem| units_of(item_len(&inner, item), units);
            let mut early = start_large_first(&inner, &plan.items, &budget, units);
            for (i, item) in plan.items.into_iter().enumerate() {
                let started = match early.remove(&i) {
                    Some(s) => s,
                    None => {
                        let n = u32::try_from(need(&item)).unwrap_or(u32::MAX);
                        let Ok(permit) = budget.clone().acquire_many_owned(n).await else {
                            return;
                        };
                        let task =
                            AbortOnDrop(tokio::spawn(pull_item(inner.clone(), item.clone())));
                        (task, permit)
                    }
                };
                if tx.send((item, started.0, started.1)).is_err() {
                    return;
                }
            }
        });
        Pull {
            rx,
            _schedule: AbortOnDrop(schedule),
        }
    }

    /// The next item in plan order, once it is pulled and verified;
    /// `Ok(None)` after the last. An item that cannot be pulled is an error
    /// (the pull stops being useful: drop it).
    pub async fn next(&mut self) -> Result<Option<(PullItem, Pulled)>> {
        let Some((item, task, permit)) = self.rx.recv().await else {
            return Ok(None);
        };
        let r = task
            .await
            .map_err(|source| ReaderError::Task {
                what: format!("pull of {item:?}"),
                source,
            })
            .and_then(|r| r);
        drop(permit);
        Ok(Some((item, r?)))
    }
}
