//! Model test: random writes and truncations against a Vec<u8>, with small chunks.

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
enum Op {
    Write { off: u64, len: usize, seed: u8 },
    Truncate(u64),
    Punch { off: u64, len: u64 },
}

const MAX: u64 = 200 * 1024;

fn op() -> impl Strategy<Value = Op> {
    // Offsets cluster around chunk boundaries of 512 and the threshold (256).
    let off = prop_oneof![
        0..MAX,
        (0u64..400).prop_map(|k| k * 512),
        (0u64..400, 0u64..3).prop_map(|(k, d)| (k * 512).saturating_sub(d)),
        0u64..600,
    ];
    prop_oneof![
        4 => (off.clone(), prop_oneof![1usize..64, 1usize..5000, 500usize..1100], any::<u8>())
            .prop_map(|(off, len, seed)| Op::Write { off, len, seed }),
        2 => off.clone().prop_map(Op::Truncate),
        1 => (off, 1u64..4000).prop_map(|(off, len)| Op::Punch { off, len }),
    ]
}

fn apply(model: &mut Vec<u8>, op: &Op) {
    match *op {
        Op::Write { off, len, seed } => {
            let d = pattern(len, seed);
            let end = off as usize + len;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].copy_from_slice(&d);
        }
        Op::Truncate(n) => model.resize(n as usize, 0),
        Op::Punch { off, len } => {
            let end = ((off + len) as usize).min(model.len());
            if (off as usize) < end {
                model[off as usize..end].fill(0);
            }
        }
    }
}

fn run(db: &Db, ops: &[Op], check_each_step: bool) -> Result<(), TestCaseError> {
    let f = db.file(Ino::ROOT, "f");
    let mut model = Vec::new();
    for op in ops {
        match *op {
            Op::Write { off, len, seed } => {
                db.write(f, off, &pattern(len, seed)).unwrap();
            }
            Op::Truncate(n) => {
                db.setattr(
                    f,
                    &SetAttr {
                        size: Some(n),
                        ..Default::default()
                    },
                )
                .unwrap();
            }
            Op::Punch { off, len } => {
                let mode = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
                db.fallocate(f, off, len, mode).unwrap();
            }
        }
        apply(&mut model, op);
        prop_assert_eq!(db.getattr(f).unwrap().size, model.len() as u64);
        let got = db.all(f);
        prop_assert!(got == model, "content differs after {:?}", op);
        if check_each_step {
            let findings = db.check().unwrap();
            prop_assert!(findings.is_empty(), "{:?}", findings);
        }
    }
    // Random reads at arbitrary offsets agree too.
    for off in [0u64, 1, 255, 256, 511, 512, 513, model.len() as u64 / 2] {
        let got = db.read(f, off, 1000).unwrap();
        let lo = (off as usize).min(model.len());
        let hi = (lo + 1000).min(model.len());
        prop_assert_eq!(&got[..], &model[lo..hi]);
    }
    // Committed, the database holds exactly the model and passes every rule.
    db.sync().unwrap();
    prop_assert_eq!(db.pending_bytes(), 0);
    let findings = db.check().unwrap();
    prop_assert!(findings.is_empty(), "{:?}", findings);
    prop_assert!(db.all(f) == model, "content differs after commit");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn writes_and_truncates_match_a_vec(ops in proptest::collection::vec(op(), 1..25)) {
        run(&fresh_with(512, 256), &ops, true)?;
    }

    /// Batched: reads and sizes merge pending bytes; truncate and punch trim them.
    #[test]
    fn batched_writes_and_truncates_match_a_vec(ops in proptest::collection::vec(op(), 1..25)) {
        run(&fresh_cfg(512, 256, Some(batching(60_000))), &ops, false)?;
    }

    /// Batched with the committer racing every step (window 0).
    #[test]
    fn batched_with_a_racing_committer_matches_a_vec(ops in proptest::collection::vec(op(), 1..25)) {
        run(&fresh_cfg(512, 256, Some(batching(0))), &ops, false)?;
    }
}
