//! The console: every view on ratatui's TestBackend from hand-built fixtures (insta snapshots
//! in tui/snapshots/), the terminal and the event loop, the feed against a real daemon, and end
//! to end in a private tmux server. One test binary; its tests share one process and run in
//! parallel.

#[path = "../support/mod.rs"]
mod support;

mod advisor;
mod bench_view;
mod control;
mod e2e_demo;
mod e2e_run;
mod event_loop;
mod events_view;
mod feed;
mod feed_knobs;
mod feed_tuner;
mod health;
mod hostile_text;
mod knobs;
mod mig;
mod power;
mod reach;
mod record_replay;
mod screen;
mod snapshots;
mod topology;
