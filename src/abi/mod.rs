//! abi
