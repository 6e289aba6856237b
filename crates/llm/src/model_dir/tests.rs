use std::fs;

use super::*;
use crate::openai::ChatMessage;
use crate::template::ChatRenderInput;

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny");

/// A temporary model directory with the tiny tokenizer and the given extra files.
fn model_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::copy(
        Path::new(TINY).join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    for (name, content) in files {
        fs::write(dir.path().join(name), content).unwrap();
    }
    dir
}

fn render(model: &ModelDir) -> String {
    let messages = [ChatMessage::new("user", "hi")];
    model
        .require_chat_template()
        .unwrap()
        .render(&ChatRenderInput {
            messages: &messages,
            add_generation_prompt: false,
            ..ChatRenderInput::default()
        })
        .unwrap()
}

#[test]
fn named_template_list_uses_default_and_added_token_objects() {
    let dir = model_dir(&[(
        "tokenizer_config.json",
        r#"{
            "bos_token": {"content": "<|endoftext|>", "lstrip": false, "special": true},
            "eos_token": {"__type": "AddedToken", "content": "<|im_end|>"},
            "chat_template": [
                {"name": "tool_use", "template": "T"},
                {"name": "default", "template": "{{ bos_token }}D{{ messages[0].content }}{{ eos_token }}"}
            ]
        }"#,
    )]);
    let model = ModelDir::load(dir.path()).unwrap();
    assert_eq!(render(&model), "<|endoftext|>Dhi<|im_end|>");
    assert_eq!(
        model.special_tokens().eos_token.as_deref(),
        Some("<|im_end|>")
    );
    let im_end = model.tokenizer().token_to_id("<|im_end|>").unwrap();
    assert_eq!(model.eos_token_ids(), &[im_end]);
    assert_eq!(model.context_length(), None);
    assert_eq!(model.vocab_size(), model.tokenizer().vocab_size());
}

#[test]
fn eos_ids_are_the_union_of_generation_config_and_tokenizer_config() {
    let dir = model_dir(&[
        ("tokenizer_config.json", r#"{"eos_token": "<|im_end|>"}"#),
        ("generation_config.json", r#"{"eos_token_id": [7, 3]}"#),
        (
            "config.json",
            r#"{"eos_token_id": 99, "n_positions": 1024, "vocab_size": 4096}"#,
        ),
    ]);
    let model = ModelDir::load(dir.path()).unwrap();
    let im_end = model.tokenizer().token_to_id("<|im_end|>").unwrap();
    let mut expected = vec![3, 7, im_end];
    expected.sort_unstable();
    assert_eq!(model.eos_token_ids(), expected.as_slice());
    assert!(model.tokenizer().is_eos(7));
    assert_eq!(model.context_length(), Some(1024));
    assert_eq!(model.vocab_size(), 4096);
    assert!(model.chat_template().is_none());
    assert!(matches!(
        model.require_chat_template().unwrap_err(),
        LlmError::NoChatTemplate
    ));
}

#[test]
fn config_eos_is_used_without_generation_config() {
    let dir = model_dir(&[(
        "config.json",
        r#"{"eos_token_id": 5, "max_position_embeddings": 2048}"#,
    )]);
    let model = ModelDir::load(dir.path()).unwrap();
    assert_eq!(model.eos_token_ids(), &[5]);
    assert_eq!(model.context_length(), Some(2048));
}

#[test]
fn chat_template_files_win_over_tokenizer_config() {
    let dir = model_dir(&[
        ("tokenizer_config.json", r#"{"chat_template": "config"}"#),
        ("chat_template.json", r#"{"chat_template": "json file"}"#),
    ]);
    assert_eq!(render(&ModelDir::load(dir.path()).unwrap()), "json file");
    fs::write(dir.path().join("chat_template.jinja"), "jinja file\n").unwrap();
    assert_eq!(render(&ModelDir::load(dir.path()).unwrap()), "jinja file");
}

#[test]
fn context_length_from_nested_config_or_model_max_length() {
    let dir = model_dir(&[
        (
            "config.json",
            r#"{"text_config": {"max_position_embeddings": 32768, "vocab_size": 10}}"#,
        ),
        ("tokenizer_config.json", r#"{"model_max_length": 4096}"#),
    ]);
    let model = ModelDir::load(dir.path()).unwrap();
    assert_eq!(model.context_length(), Some(32768));
    assert_eq!(model.vocab_size(), 10);

    let dir = model_dir(&[("tokenizer_config.json", r#"{"model_max_length": 4096}"#)]);
    assert_eq!(
        ModelDir::load(dir.path()).unwrap().context_length(),
        Some(4096)
    );

    let dir = model_dir(&[(
        "tokenizer_config.json",
        r#"{"model_max_length": 1000000000000000019884624838656}"#,
    )]);
    assert_eq!(ModelDir::load(dir.path()).unwrap().context_length(), None);
}

#[test]
fn broken_directories_are_internal_errors() {
    let empty = tempfile::tempdir().unwrap();
    let err = ModelDir::load(empty.path()).unwrap_err();
    assert!(matches!(err, LlmError::InvalidModel { .. }), "{err}");
    assert!(!err.is_user_error());

    let dir = model_dir(&[("config.json", "{not json")]);
    let err = ModelDir::load(dir.path()).unwrap_err();
    assert!(matches!(err, LlmError::ModelJson { .. }), "{err}");

    let dir = model_dir(&[("tokenizer_config.json", r#"{"chat_template": "{% if %}"}"#)]);
    let err = ModelDir::load(dir.path()).unwrap_err();
    assert!(matches!(err, LlmError::TemplateSyntax(_)), "{err}");
    assert!(!err.is_user_error());

    let dir = model_dir(&[("tokenizer.json", "{}")]);
    let err = ModelDir::load(dir.path()).unwrap_err();
    assert!(matches!(err, LlmError::Tokenizer(_)), "{err}");
}
