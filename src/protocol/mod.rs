//! The FUSE wire protocol, independent of the transport: [`decode()`] turns request bytes into a
//! typed [`Operation`], [`reply`](mod@reply) turns answers into bytes. Errno mapping lives in
//! `crate::errno`, not here.

pub mod decode;
pub mod reply;

pub use decode::{
    decode, decode_parts, expects_reply, op_in_size, DecodeError, ForgetIter, ForgetList, Header,
    Operation, Request, IN_HEADER_SIZE,
};
pub use reply::{out_header, DirBuf, DirPlusBuf, Reply, OUT_HEADER_SIZE};
