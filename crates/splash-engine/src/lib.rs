//! splash-engine
