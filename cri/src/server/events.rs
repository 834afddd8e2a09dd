//! The event broadcast behind `GetContainerEvents` (`container_events.rs` feeds it): bounded for
//! slow subscribers, with the exits found at start-up kept for a kubelet that reconnects.

use crishim_proto::cri::ContainerEventResponse;
use crishim_state::records::now_nanos;
use futures::StreamExt;
use tonic::Status;

/// Events buffered for slow subscribers before they miss some.
const EVENT_BUFFER: usize = 1024;
/// How long after start-up a new subscriber is told about exits that happened while we were down.
const REPLAY_WINDOW: std::time::Duration = std::time::Duration::from_secs(120);

pub(super) type EventStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<ContainerEventResponse, Status>> + Send + 'static>,
>;

/// The event broadcast, and the exits found at start-up that happened while the daemon was down.
pub(super) struct Events {
    sender: tokio::sync::broadcast::Sender<ContainerEventResponse>,
    /// Kept for subscribers that connect within [`REPLAY_WINDOW`] of start-up.
    replay: std::sync::Mutex<Vec<ContainerEventResponse>>,
    started: std::time::Instant,
    started_nanos: i64,
}

impl Events {
    pub(super) fn new() -> Self {
        let (sender, _) = tokio::sync::broadcast::channel(EVENT_BUFFER);
        Events {
            sender,
            replay: Default::default(),
            started: std::time::Instant::now(),
            started_nanos: now_nanos(),
        }
    }

    pub(super) fn has_subscribers(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    /// Whether a time (ns since the epoch) is before this daemon started.
    pub(super) fn before_start(&self, nanos: i64) -> bool {
        nanos < self.started_nanos
    }

    pub(super) fn send(&self, event: ContainerEventResponse) {
        let _ = self.sender.send(event);
    }

    /// Keep an exit that happened while the daemon was down for late subscribers (bounded).
    pub(super) fn keep_for_replay(&self, event: &ContainerEventResponse) {
        let mut replay = self.replay.lock().unwrap();
        if replay.len() < EVENT_BUFFER {
            replay.push(event.clone());
        }
    }

    /// A subscriber's stream: the kept exits if it connects soon after start-up (a kubelet
    /// reconnecting), then every event as it happens.
    pub(super) fn subscribe(&self) -> EventStream {
        let rx = self.sender.subscribe();
        let replay: Vec<_> = if self.started.elapsed() < REPLAY_WINDOW {
            self.replay.lock().unwrap().clone()
        } else {
            Vec::new()
        };
        let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(|e| async move {
            // A subscriber that fell behind skips what it missed; the kubelet relists then.
            e.ok().map(Ok::<_, Status>)
        });
        Box::pin(futures::stream::iter(replay.into_iter().map(Ok)).chain(live))
    }
}
