//! splash-server
