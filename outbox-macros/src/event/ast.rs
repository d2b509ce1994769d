//! The event type as the derive sees it: its shape, its attributes, and references back to the
//! original tokens for spans.

use syn::{Data, DeriveInput, Fields, Generics, Ident, Type};

use super::attr;
use crate::ctxt::Ctxt;
use crate::symbol::OUTBOX;

/// What kind of type the derive is on.
pub(crate) enum Shape<'a> {
    /// A struct with named fields: the supported, evolvable payload.
    Named(Vec<Field<'a>>),
    /// An enum (serde decides how it is represented).
    Enum,
    /// `struct X(..);`
    Tuple(&'a syn::FieldsUnnamed),
    /// `struct X;`
    Unit,
    /// A union (serde cannot represent it).
    Union,
}

/// One named field.
pub(crate) struct Field<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) ty: &'a Type,
    pub(crate) attrs: attr::Field,
}

/// The parsed derive input.
pub(crate) struct EventInput<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) generics: &'a Generics,
    pub(crate) attrs: attr::Container,
    pub(crate) shape: Shape<'a>,
}

impl<'a> EventInput<'a> {
    pub(crate) fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Self {
        let attrs = attr::Container::from_attrs(cx, &input.attrs);
        let shape = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => Shape::Named(
                    named
                        .named
                        .iter()
                        .map(|f| Field {
                            ident: f.ident.as_ref().expect("named field has an ident"),
                            ty: &f.ty,
                            attrs: attr::Field::from_attrs(cx, &f.attrs),
                        })
                        .collect(),
                ),
                Fields::Unnamed(unnamed) => Shape::Tuple(unnamed),
                Fields::Unit => Shape::Unit,
            },
            Data::Enum(data) => {
                reject_outbox_attrs_in_enum(cx, data);
                Shape::Enum
            }
            Data::Union(_) => Shape::Union,
        };
        EventInput {
            ident: &input.ident,
            generics: &input.generics,
            attrs,
            shape,
        }
    }

    /// The named fields (empty for other shapes).
    pub(crate) fn fields(&self) -> &[Field<'a>] {
        match &self.shape {
            Shape::Named(fields) => fields,
            _ => &[],
        }
    }
}

/// An enum payload has no single field to take the aggregate id from.
fn reject_outbox_attrs_in_enum(cx: &Ctxt, data: &syn::DataEnum) {
    let variant_attrs = data.variants.iter().flat_map(|v| v.attrs.iter());
    let field_attrs = data
        .variants
        .iter()
        .flat_map(|v| v.fields.iter())
        .flat_map(|f| f.attrs.iter());
    for attr in variant_attrs
        .chain(field_attrs)
        .filter(|a| a.path() == OUTBOX)
    {
        cx.error_spanned_by(
            attr,
            "`#[outbox(...)]` is not supported inside an enum payload: an enum event has no aggregate id; \
             to get one, make the event a struct with an `#[outbox(aggregate_id)]` field and put the enum in another field",
        );
    }
}
