//! The sandbox engine.
