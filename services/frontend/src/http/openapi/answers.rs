//! Schemas of the answers the handlers build as JSON rather than from a typed struct: the
//! Responses API's response object, the Anthropic message and the token count. They list the
//! fields every answer carries (required) with their types, so a client generated from the
//! document, or a conformance checker, sees what it will get.

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
use utoipa::openapi::{RefOr, Schema};

fn typed(schema_type: Type) -> RefOr<Schema> {
    ObjectBuilder::new().schema_type(schema_type).into()
}

fn nullable(schema_type: Type) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([schema_type, Type::Null]))
        .into()
}

fn one_of(values: &[&str]) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
        .into()
}

/// An object whose listed properties are all required; others may appear.
fn object(properties: Vec<(&str, RefOr<Schema>)>) -> RefOr<Schema> {
    properties
        .into_iter()
        .fold(
            ObjectBuilder::new().schema_type(Type::Object),
            |schema, (name, property)| schema.property(name, property).required(name),
        )
        .into()
}

fn list_of(item: RefOr<Schema>) -> RefOr<Schema> {
    ArrayBuilder::new().items(item).into()
}

/// `POST /v1/responses` without `stream`: the response object.
pub(super) fn response_object() -> RefOr<Schema> {
    let output_item = object(vec![("type", typed(Type::String))]);
    let usage = object(vec![
        ("input_tokens", typed(Type::Integer)),
        ("output_tokens", typed(Type::Integer)),
        ("total_tokens", typed(Type::Integer)),
    ]);
    object(vec![
        ("id", typed(Type::String)),
        ("object", one_of(&["response"])),
        ("created_at", typed(Type::Integer)),
        (
            "status",
            one_of(&["completed", "incomplete", "failed", "in_progress"]),
        ),
        ("model", typed(Type::String)),
        ("output", list_of(output_item)),
        ("error", nullable(Type::Object)),
        ("incomplete_details", nullable(Type::Object)),
        ("usage", usage),
    ])
}

/// `POST /v1/messages` without `stream`: the assistant message.
pub(super) fn message_object() -> RefOr<Schema> {
    let block = object(vec![("type", typed(Type::String))]);
    let usage = object(vec![
        ("input_tokens", typed(Type::Integer)),
        ("output_tokens", typed(Type::Integer)),
    ]);
    object(vec![
        ("id", typed(Type::String)),
        ("type", one_of(&["message"])),
        ("role", one_of(&["assistant"])),
        ("model", typed(Type::String)),
        ("content", list_of(block)),
        ("stop_reason", nullable(Type::String)),
        ("stop_sequence", nullable(Type::String)),
        ("usage", usage),
    ])
}

/// `POST /v1/messages/count_tokens`: the prompt's token count.
pub(super) fn token_count() -> RefOr<Schema> {
    object(vec![("input_tokens", typed(Type::Integer))])
}
