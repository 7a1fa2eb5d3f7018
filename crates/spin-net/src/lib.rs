//! The Multi-SPIN system over a network: an edge server and devices speaking a versioned wire protocol over TCP,
//! every message held on an emulated wireless link driven by spin-channel, and the controller planning every round.
//!
//! This is the only crate of the workspace that depends on tokio or opens sockets. [`proto`] is the wire format
//! (docs/protocol.md), [`server`] the edge server, [`device`] an edge device, [`link`] the link emulation,
//! [`controller`] the planner in the loop, [`printer`] the thread that writes notices, [`sim`] the one-process simulation (server and K devices over
//! loopback) and [`baselines`] paper A's Cen-SPIN, P2P-SPIN and plain decoding beside it. docs/system.md
//! describes the round as implemented.

pub mod baselines;
pub mod blocking;
pub mod controller;
pub mod device;
pub mod error;
pub mod link;
pub mod printer;
pub mod proto;
pub mod server;
pub mod sim;
pub mod tls;
pub mod wire;

pub use error::{NetError, Result};
