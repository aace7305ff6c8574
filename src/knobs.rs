//! Every tunable of AgentFS, read from `AGENTFS_*` environment variables in exactly one place.
//!
//! The rows live in `knobs_table.rs`; this module gives them types and ranges, `build.rs` renders
//! them into KNOBS.md. No other module reads the environment for a knob.

use std::sync::OnceLock;

/// Whether a knob chooses a policy or switches a mechanism off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnobKind {
    Policy,
    KillSwitch,
}

/// One row of the knob ledger.
#[derive(Clone, Copy, Debug)]
pub struct KnobDef {
    pub name: &'static str,
    pub ty: &'static str,
    pub default: &'static str,
    pub min: u64,
    pub max: u64,
    pub kind: KnobKind,
    pub meaning: &'static str,
}

/// A knob with a value that does not parse or lies outside its range.
#[derive(Debug, thiserror::Error)]
#[error("{name}={value:?} is invalid: {why}")]
pub struct KnobError {
    pub name: &'static str,
    pub value: String,
    pub why: String,
}

type Bool = bool;
type U64 = u64;
type Str = String;

trait KnobValue: Sized {
    fn parse(name: &'static str, raw: &str, min: u64, max: u64) -> Result<Self, KnobError>;
}

impl KnobValue for bool {
    fn parse(name: &'static str, raw: &str, _: u64, _: u64) -> Result<Self, KnobError> {
        match raw.trim() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(KnobError {
                name,
                value: raw.to_string(),
                why: "expected 0 or 1".into(),
            }),
        }
    }
}

impl KnobValue for u64 {
    fn parse(name: &'static str, raw: &str, min: u64, max: u64) -> Result<Self, KnobError> {
        let err = |why: String| KnobError {
            name,
            value: raw.to_string(),
            why,
        };
        let v: u64 = raw
            .trim()
            .parse()
            .map_err(|_| err("expected a whole number".into()))?;
        if v < min || v > max {
            return Err(err(format!("expected {min}..={max}")));
        }
        Ok(v)
    }
}

impl KnobValue for String {
    fn parse(_: &'static str, raw: &str, _: u64, _: u64) -> Result<Self, KnobError> {
        Ok(raw.to_string())
    }
}

trait KnobDefault {
    type Raw;
    fn make(raw: Self::Raw) -> Self;
}

impl KnobDefault for bool {
    type Raw = bool;
    fn make(raw: bool) -> Self {
        raw
    }
}

impl KnobDefault for u64 {
    type Raw = u64;
    fn make(raw: u64) -> Self {
        raw
    }
}

impl KnobDefault for String {
    type Raw = &'static str;
    fn make(raw: &'static str) -> Self {
        raw.to_string()
    }
}

fn read<T: KnobValue>(name: &'static str, min: u64, max: u64) -> Result<Option<T>, KnobError> {
    match std::env::var(name) {
        Ok(raw) => T::parse(name, &raw, min, max).map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(KnobError {
            name,
            value: String::new(),
            why: "not valid UTF-8".into(),
        }),
    }
}

macro_rules! knob_table {
    ($( $field:ident : $ty:ident = $default:expr, [$min:expr, $max:expr], $kind:ident,
        $env:literal, $meaning:literal; )*) => {
        /// The values of every knob, typed.
        #[derive(Clone, Debug)]
        pub struct Knobs {
            $( #[doc = $meaning] pub $field: $ty, )*
        }

        impl Knobs {
            /// Every knob at its default.
            pub fn defaults() -> Self {
                Self { $( $field: <$ty as KnobDefault>::make($default), )* }
            }

            /// Read every knob from the environment, validating types and ranges.
            pub fn from_env() -> Result<Self, KnobError> {
                Ok(Self {
                    $( $field: read::<$ty>($env, $min, $max)?.unwrap_or_else(|| <$ty as KnobDefault>::make($default)), )*
                })
            }
        }

        /// The ledger, in declaration order.
        pub const TABLE: &[KnobDef] = &[
            $( KnobDef {
                name: $env,
                ty: stringify!($ty),
                default: stringify!($default),
                min: $min,
                max: $max,
                kind: KnobKind::$kind,
                meaning: $meaning,
            }, )*
        ];
    };
}

include!("knobs_table.rs");

static KNOBS: OnceLock<Knobs> = OnceLock::new();

/// Validate the environment once at program start; a bad value is a one-line error.
pub fn load() -> Result<&'static Knobs, KnobError> {
    if let Some(k) = KNOBS.get() {
        return Ok(k);
    }
    let k = Knobs::from_env()?;
    Ok(KNOBS.get_or_init(|| k))
}

/// The knob values. Before [`load`] has succeeded this reads the environment and falls back to
/// defaults for invalid values (the CLI always calls `load` first and reports them).
pub fn get() -> &'static Knobs {
    KNOBS.get_or_init(|| Knobs::from_env().unwrap_or_else(|_| Knobs::defaults()))
}

/// KNOBS.md as rendered by build.rs from the same table.
pub const LEDGER_MARKDOWN: &str = include_str!(concat!(env!("OUT_DIR"), "/KNOBS.md"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_enforced() {
        assert!(u64::parse("AGENTFS_X", "5", 1, 10).is_ok());
        assert!(u64::parse("AGENTFS_X", "11", 1, 10).is_err());
        assert!(u64::parse("AGENTFS_X", "x", 1, 10).is_err());
        assert!(bool::parse("AGENTFS_X", "2", 0, 1).is_err());
    }

    #[test]
    fn defaults_lie_in_their_ranges() {
        for k in TABLE {
            if k.ty == "U64" {
                let v: u64 = k.default.parse().expect("numeric default");
                assert!(v >= k.min && v <= k.max, "{} default out of range", k.name);
            }
        }
    }
}
