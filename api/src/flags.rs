//! Component command-line flags: which field of a component config becomes which flag (kOps'
//! `flag:` struct tags, read by `tools/gen_flag_table.py` into [`crate::flag_table`]). The table is
//! data: nodeup renders the flags from it (`nodeup::flags::build`), and the classification of spec
//! fields ([`crate::support`]) counts a field with a flag as consumed by that flag.

/// How a field's value is rendered.
#[derive(Debug, Clone, Copy)]
pub enum FlagKind {
    Str,
    Bool,
    Int,
    Float,
    Duration,
    Quantity,
    StrList,
    StrMap,
    /// A nested struct whose own fields carry flags.
    Nested(&'static [FlagSpec]),
}

/// One field → flag mapping.
#[derive(Debug, Clone, Copy)]
pub struct FlagSpec {
    /// JSON key in the spec.
    pub key: &'static str,
    pub flag: &'static str,
    /// Repeat the flag per list item instead of joining with commas.
    pub repeat: bool,
    /// The value meaning "unset" (no flag written).
    pub empty: Option<&'static str>,
    /// Write the flag even for an empty string.
    pub include_empty: bool,
    /// Optional in kOps' type: absent means no flag (otherwise absent means the zero value).
    pub pointer: bool,
    pub kind: FlagKind,
}
