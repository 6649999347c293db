//! splash-model
