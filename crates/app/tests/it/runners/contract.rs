//! The description contract the host supports (canonical roles, periodic hybrid topology), one
//! rule at a time: a valid record built in Rust, changed in one way per case, copied and checked
//! exactly as selection does after a runner's `describe`.

use std::ffi::{c_char, CString};
use std::ptr;

use guild_abi::{
    guild_runner_model_v1_t, guild_tensor_role_v1_t, GUILD_PREFILL_CHUNKED,
    GUILD_RUNNER_MODEL_VERSION, GUILD_TENSOR_ROLE_FLAG_OPTIONAL as OPTIONAL,
};
use guild_host::models::description::{check_record, MAX_TENSOR_ROLES};
use guild_host::models::{DescriptionError, LayerKind, ModelDescription, TensorRoleKind as R};
use guild_ports::fakes::FakeModel;

/// A description record and its roles as plain data: `(role, layer, name, flags, reserved)`.
#[derive(Clone)]
struct Desc {
    record: guild_runner_model_v1_t,
    roles: Vec<(u32, i32, String, u32, u32)>,
}

impl Desc {
    /// Four layers, full attention on every second (layers 1 and 3), the recurrent layers with
    /// their three required SSM roles, the attention layers with a fused QKV and an output.
    fn hybrid() -> Desc {
        // SAFETY: every field of the record is valid as all-zero bytes (integers, floats, a
        // char array, a NULL pointer).
        let mut record: guild_runner_model_v1_t = unsafe { std::mem::zeroed() };
        record.struct_size = size_of::<guild_runner_model_v1_t>() as u32;
        record.version = GUILD_RUNNER_MODEL_VERSION;
        for (slot, byte) in record.architecture.iter_mut().zip(b"hybrid\0") {
            *slot = *byte as c_char;
        }
        record.n_layers = 4;
        record.full_attention_interval = 2;
        record.ssm_conv_kernel = 4;
        record.ssm_state_size = 16;
        record.ssm_inner_size = 64;
        let mut d = Desc {
            record,
            roles: Vec::new(),
        };
        d.add(R::TokenEmbd, -1, "token_embd.weight");
        for layer in 0..4 {
            if (layer + 1) % 2 == 0 {
                d.add(R::AttnQkv, layer, &format!("blk.{layer}.attn_qkv.weight"));
                d.add(
                    R::AttnOutput,
                    layer,
                    &format!("blk.{layer}.attn_output.weight"),
                );
            } else {
                for (role, name) in [
                    (R::SsmIn, "ssm_in"),
                    (R::SsmConv1d, "ssm_conv1d"),
                    (R::SsmOut, "ssm_out"),
                ] {
                    d.add(role, layer, &format!("blk.{layer}.{name}.weight"));
                }
            }
            d.add(R::FfnUp, layer, &format!("blk.{layer}.ffn_up.weight"));
        }
        d
    }

    fn add(&mut self, role: R, layer: i32, name: &str) {
        self.roles.push((role.raw(), layer, name.to_owned(), 0, 0));
    }

    fn remove(&mut self, role: R, layer: i32) {
        self.roles.retain(|r| (r.0, r.1) != (role.raw(), layer));
    }

    /// A model holding every tensor this description names.
    fn model(&self) -> FakeModel {
        self.roles
            .iter()
            .fold(FakeModel::new("/models/contract.gguf"), |m, r| {
                m.with_tensor(&r.2, 0, &[4, 4])
            })
    }

    /// Copies and checks the record against `model`, as selection does.
    fn check_against(&self, model: &FakeModel) -> Result<ModelDescription, DescriptionError> {
        let names: Vec<CString> = self
            .roles
            .iter()
            .map(|r| CString::new(r.2.as_str()).unwrap())
            .collect();
        let records: Vec<guild_tensor_role_v1_t> = self
            .roles
            .iter()
            .zip(&names)
            .map(|(r, name)| guild_tensor_role_v1_t {
                role: r.0,
                layer: r.1,
                name: name.as_ptr(),
                flags: r.3,
                reserved: r.4,
            })
            .collect();
        let mut record = self.record;
        record.tensor_roles = records.as_ptr();
        record.tensor_role_count = records.len();
        // SAFETY: the role records and their names live until the end of this function.
        unsafe { check_record(&record, model) }
    }

    fn check(&self) -> Result<ModelDescription, DescriptionError> {
        self.check_against(&self.model())
    }
}

/// `hybrid()` with `change` applied must fail with `expected`.
fn refused(change: impl FnOnce(&mut Desc), expected: DescriptionError) {
    let mut d = Desc::hybrid();
    let model = d.model();
    change(&mut d);
    assert_eq!(d.check_against(&model), Err(expected));
}

#[test]
fn a_valid_hybrid_is_accepted_with_its_layer_kinds_and_tensors() {
    let d = Desc::hybrid().check().unwrap();
    assert_eq!(d.architecture, "hybrid");
    let kinds: Vec<LayerKind> = (0..4).map(|l| d.layer_kind(l)).collect();
    use LayerKind::{Attention as A, Recurrent as Rc};
    assert_eq!(kinds, [Rc, A, Rc, A]);
    assert_eq!(d.roles.len(), 1 + 2 * 4 + 2 * 3);
    assert!(d.roles.iter().all(|r| r.tensor.is_some() && !r.optional));
    assert_eq!(
        d.role(R::SsmIn, Some(2)).unwrap().name,
        "blk.2.ssm_in.weight"
    );

    // Separate Q, K and V stand in for a fused QKV.
    let mut split = Desc::hybrid();
    split.remove(R::AttnQkv, 1);
    for (role, name) in [(R::AttnQ, "q"), (R::AttnK, "k"), (R::AttnV, "v")] {
        split.add(role, 1, &format!("blk.1.attn_{name}.weight"));
    }
    assert!(split.check().is_ok());

    // An optional role whose tensor is absent is kept, marked absent, and does not count.
    let mut optional = Desc::hybrid();
    let model = optional.model();
    optional.roles.push((
        R::AttnQNorm.raw(),
        0,
        "blk.0.attn_q_norm.weight".into(),
        OPTIONAL,
        0,
    ));
    let d = optional.check_against(&model).unwrap();
    let q_norm = d.role(R::AttnQNorm, Some(0)).unwrap();
    assert_eq!((q_norm.optional, q_norm.tensor), (true, None));

    // Interval 0: every layer is an attention layer.
    let mut dense = Desc {
        roles: Vec::new(),
        ..Desc::hybrid()
    };
    dense.record.full_attention_interval = 0;
    dense.record.ssm_conv_kernel = 0;
    dense.add(R::TokenEmbd, -1, "token_embd.weight");
    for layer in 0..4 {
        dense.add(R::AttnQkv, layer, &format!("blk.{layer}.attn_qkv.weight"));
        dense.add(
            R::AttnOutput,
            layer,
            &format!("blk.{layer}.attn_output.weight"),
        );
    }
    assert!(dense.check().is_ok());
}

#[test]
fn a_malformed_record_is_refused() {
    refused(
        |d| d.record.struct_size += 8,
        DescriptionError::HeaderChanged {
            field: "struct_size",
            expected: size_of::<guild_runner_model_v1_t>() as u32,
            found: size_of::<guild_runner_model_v1_t>() as u32 + 8,
        },
    );
    refused(
        |d| d.record.version = 2,
        DescriptionError::HeaderChanged {
            field: "version",
            expected: 1,
            found: 2,
        },
    );
    refused(
        |d| d.record.architecture = [b'x' as c_char; 64],
        DescriptionError::Architecture("has no NUL within its 64 bytes"),
    );
    refused(
        |d| d.record.architecture[0] = 0,
        DescriptionError::Architecture("is empty"),
    );
    refused(
        |d| d.record.architecture[0] = 0xffu8 as c_char,
        DescriptionError::Architecture("is not UTF-8"),
    );
    refused(
        |d| d.record.rope_type = 4,
        DescriptionError::UnknownValue {
            field: "rope_type",
            value: 4,
        },
    );
    refused(
        |d| d.record.prefill_strategy = GUILD_PREFILL_CHUNKED,
        DescriptionError::ChunkedWithoutSize,
    );
    refused(|d| d.record.n_layers = 0, DescriptionError::NoLayers);
    refused(
        |d| d.roles[3].4 = 1,
        DescriptionError::RoleRecord {
            index: 3,
            problem: "reserved is 1, not 0".into(),
        },
    );
    refused(
        |d| d.roles[0].3 = 0b10,
        DescriptionError::RoleRecord {
            index: 0,
            problem: "flags 0x2 hold a bit this host does not know".into(),
        },
    );
}

#[test]
fn role_records_that_cannot_be_read_are_refused() {
    let d = Desc::hybrid();
    let model = d.model();
    let mut record = d.record;
    // A count without records, and a count above the bound (refused before anything is read).
    record.tensor_role_count = 3;
    // SAFETY: tensor_roles is NULL, which the check must refuse without reading.
    let missing = unsafe { check_record(&record, &model) };
    assert_eq!(missing, Err(DescriptionError::RolesMissing(3)));
    record.tensor_roles = ptr::NonNull::dangling().as_ptr();
    record.tensor_role_count = MAX_TENSOR_ROLES + 1;
    // SAFETY: the count is above the bound, so the check refuses it before reading any record.
    let too_many = unsafe { check_record(&record, &model) };
    assert_eq!(
        too_many,
        Err(DescriptionError::TooManyRoles {
            count: MAX_TENSOR_ROLES + 1,
            max: MAX_TENSOR_ROLES
        })
    );
    // A NULL name.
    let roles = [guild_tensor_role_v1_t {
        role: R::TokenEmbd.raw(),
        layer: -1,
        name: ptr::null(),
        flags: 0,
        reserved: 0,
    }];
    record.tensor_roles = roles.as_ptr();
    record.tensor_role_count = 1;
    // SAFETY: one live record whose NULL name the check must refuse.
    let nameless = unsafe { check_record(&record, &model) };
    assert_eq!(
        nameless,
        Err(DescriptionError::RoleName {
            index: 0,
            problem: "is NULL".into()
        })
    );
}

#[test]
fn roles_outside_the_canonical_set_or_their_scope_are_refused() {
    refused(
        |d| d.roles[1].0 = 0,
        DescriptionError::UnknownRole {
            index: 1,
            role: 0,
            name: "blk.0.ssm_in.weight".into(),
        },
    );
    refused(
        |d| d.roles[1].0 = 37,
        DescriptionError::UnknownRole {
            index: 1,
            role: 37,
            name: "blk.0.ssm_in.weight".into(),
        },
    );
    refused(
        |d| d.roles[0].1 = 0,
        DescriptionError::RoleScope {
            role: R::TokenEmbd,
            layer: 0,
            name: "token_embd.weight".into(),
            problem: "a model-wide role takes layer -1".into(),
        },
    );
    refused(
        |d| d.roles[1].1 = -1,
        DescriptionError::RoleScope {
            role: R::SsmIn,
            layer: -1,
            name: "blk.0.ssm_in.weight".into(),
            problem: "a per-layer role needs a layer".into(),
        },
    );
    refused(
        |d| d.roles[1].1 = 4,
        DescriptionError::RoleScope {
            role: R::SsmIn,
            layer: 4,
            name: "blk.0.ssm_in.weight".into(),
            problem: "layers run from 0 to 3".into(),
        },
    );
    refused(
        |d| d.roles[1].1 = -2,
        DescriptionError::RoleScope {
            role: R::SsmIn,
            layer: -2,
            name: "blk.0.ssm_in.weight".into(),
            problem: "layers run from 0 to 3".into(),
        },
    );
    refused(
        |d| d.add(R::SsmIn, 0, "blk.0.ffn_up.weight"),
        DescriptionError::DuplicateRole {
            role: R::SsmIn,
            layer: Some(0),
        },
    );
    refused(
        |d| d.roles[2].2 = "blk.0.conv.weight".into(),
        DescriptionError::MissingTensor {
            role: R::SsmConv1d,
            layer: Some(0),
            name: "blk.0.conv.weight".into(),
        },
    );
    refused(
        |d| d.remove(R::TokenEmbd, -1),
        DescriptionError::MissingRole {
            role: R::TokenEmbd,
            layer: None,
            alternative: None,
        },
    );
    // ROPE_FREQS may be model-wide or per layer.
    let mut d = Desc::hybrid();
    d.add(R::RopeFreqs, -1, "rope_freqs.weight");
    d.add(R::RopeFreqs, 1, "rope_freqs.weight");
    assert!(d.check().is_ok());
}

#[test]
fn mappings_that_break_the_periodic_hybrid_topology_are_refused() {
    refused(
        |d| d.record.full_attention_interval = 5,
        DescriptionError::IntervalBeyondLayers {
            interval: 5,
            n_layers: 4,
        },
    );
    // An attention role on a recurrent layer, an SSM role on an attention layer.
    refused(
        |d| d.add(R::AttnOutput, 0, "blk.1.attn_output.weight"),
        DescriptionError::RoleOnWrongLayer {
            role: R::AttnOutput,
            layer: 0,
            kind: LayerKind::Recurrent,
        },
    );
    refused(
        |d| d.add(R::SsmA, 3, "blk.0.ssm_in.weight"),
        DescriptionError::RoleOnWrongLayer {
            role: R::SsmA,
            layer: 3,
            kind: LayerKind::Attention,
        },
    );
    // Interval 1 makes every layer an attention layer, so layer 0's SSM roles are foreign.
    refused(
        |d| d.record.full_attention_interval = 1,
        DescriptionError::RoleOnWrongLayer {
            role: R::SsmIn,
            layer: 0,
            kind: LayerKind::Attention,
        },
    );
    // Required roles per kind.
    refused(
        |d| d.remove(R::SsmOut, 2),
        DescriptionError::MissingRole {
            role: R::SsmOut,
            layer: Some(2),
            alternative: None,
        },
    );
    refused(
        |d| {
            d.remove(R::AttnQkv, 3);
            d.add(R::AttnQ, 3, "blk.0.ffn_up.weight");
        },
        DescriptionError::MissingRole {
            role: R::AttnK,
            layer: Some(3),
            alternative: Some(R::AttnQkv),
        },
    );
    refused(
        |d| d.remove(R::AttnOutput, 1),
        DescriptionError::MissingRole {
            role: R::AttnOutput,
            layer: Some(1),
            alternative: None,
        },
    );
    // A required role marked optional whose tensor is absent does not count.
    refused(
        |d| {
            let out = d.roles.iter_mut().find(|r| r.0 == R::SsmOut.raw()).unwrap();
            out.2 = "blk.0.ssm_out_absent.weight".into();
            out.3 = OPTIONAL;
        },
        DescriptionError::MissingRole {
            role: R::SsmOut,
            layer: Some(0),
            alternative: None,
        },
    );
    refused(
        |d| d.record.ssm_state_size = 0,
        DescriptionError::RecurrentGeometry {
            field: "ssm_state_size",
        },
    );
}

#[test]
fn refusals_read_as_one_line_naming_what_failed() {
    let text = |e: DescriptionError| e.to_string();
    assert_eq!(
        text(DescriptionError::MissingRole {
            role: R::AttnK,
            layer: Some(3),
            alternative: Some(R::AttnQkv),
        }),
        "layer 3 has no ATTN_K (nor ATTN_QKV)"
    );
    assert_eq!(
        text(DescriptionError::RoleOnWrongLayer {
            role: R::AttnQkv,
            layer: 0,
            kind: LayerKind::Recurrent,
        }),
        "ATTN_QKV is mapped on layer 0, which is a recurrent layer"
    );
    assert_eq!(
        text(DescriptionError::MissingTensor {
            role: R::TokenEmbd,
            layer: None,
            name: "tok.weight".into(),
        }),
        "TOKEN_EMBD on the model names tensor tok.weight, which the model does not have"
    );
}
