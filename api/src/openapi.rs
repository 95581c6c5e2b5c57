//! The OpenAPI 3.1 document, generated from the handlers' annotations and the types
//! they take and return, so that it cannot drift from the code. The input rules it states
//! come from [`crate::rules`], which the handlers check; request bodies are held to it by
//! [`crate::extract::JsonBody`] with the rules of [`crate::strict`].

use std::sync::OnceLock;

use axum::{Extension, Json};
use outbox::http::Authentication;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement};
use utoipa::openapi::{ContentBuilder, ObjectBuilder, Ref, ResponseBuilder, Type};
use utoipa::{Modify, OpenApi};

use crate::error::{FieldError, Problem};
use crate::orders::handlers;
use crate::orders::model::{CreateOrder, LineItem, OrderStatus, OrderView};
use crate::transactions::{self, TransactionState, TransactionStatus};

/// The API's description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Orders on the control-message outbox",
        description = "State changes and their events, committed together."
    ),
    paths(
        handlers::orders_create,
        handlers::orders_get,
        handlers::orders_add_item,
        handlers::orders_remove_item,
        handlers::orders_cancel,
        transactions::transactions_get,
    ),
    components(schemas(
        CreateOrder,
        LineItem,
        OrderStatus,
        OrderView,
        TransactionStatus,
        TransactionState,
        Problem,
        FieldError
    )),
    modifiers(&SignIn)
)]
pub struct ApiDoc;

/// The name of the security scheme: a bearer JWT that API Gateway's authorizer verifies.
pub const SECURITY_SCHEME: &str = "bearer";

/// The scope a token needs to read (`GET`).
pub const READ_SCOPE: &str = "orders/read";

/// The scope a token needs to change anything (every other method).
pub const WRITE_SCOPE: &str = "orders/write";

/// The scope each route needs: reading for `GET`, writing for the rest.
pub fn scope_for(method: &axum::http::Method) -> &'static str {
    if method == axum::http::Method::GET {
        READ_SCOPE
    } else {
        WRITE_SCOPE
    }
}

/// Sign-in, stated in the document: the bearer scheme, each operation's scope, and the
/// answers API Gateway gives before the API runs (401 without a valid token, 403 without
/// the route's scope, 429 over the stage's throttling), besides the API's own 401 when a
/// request reaches it without a verified caller and 403 when its caller lacks the scope.
struct SignIn;

impl Modify for SignIn {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            SECURITY_SCHEME,
            utoipa::openapi::security::SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "An access token of the stack's user pool (or the configured issuer), verified by API Gateway",
                    ))
                    .build(),
            ),
        );
        for item in openapi.paths.paths.values_mut() {
            let operations: [(axum::http::Method, &mut Option<Operation>); 4] = [
                (axum::http::Method::GET, &mut item.get),
                (axum::http::Method::POST, &mut item.post),
                (axum::http::Method::PUT, &mut item.put),
                (axum::http::Method::DELETE, &mut item.delete),
            ];
            for (method, operation) in operations {
                let Some(operation) = operation.as_mut() else { continue };
                operation.security = Some(vec![SecurityRequirement::new(SECURITY_SCHEME, [scope_for(&method)])]);
                let responses = &mut operation.responses.responses;
                responses.insert(
                    "401".into(),
                    ResponseBuilder::new()
                        .description("No valid token: API Gateway's answer, or the API's own (problem+json) when a request reaches it without a verified caller")
                        .content("application/json", gateway_message())
                        .content(
                            "application/problem+json",
                            ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build(),
                        )
                        .build()
                        .into(),
                );
                responses.insert(
                    "403".into(),
                    ResponseBuilder::new()
                        .description(format!(
                            "The token lacks the scope {}: API Gateway's answer, or the API's own (problem+json, insufficient-scope), which checks each route's scope itself",
                            scope_for(&method)
                        ))
                        .content("application/json", gateway_message())
                        .content(
                            "application/problem+json",
                            ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build(),
                        )
                        .build()
                        .into(),
                );
                responses.insert(
                    "429".into(),
                    ResponseBuilder::new()
                        .description("Over the stage's throttling limits (API Gateway's answer): nothing was written; retry later")
                        .content("application/json", gateway_message())
                        .build()
                        .into(),
                );
            }
        }
    }
}

/// API Gateway's own answers: `{"message": "Unauthorized"}` and the like.
fn gateway_message() -> utoipa::openapi::Content {
    ContentBuilder::new()
        .schema(Some(
            ObjectBuilder::new()
                .property("message", ObjectBuilder::new().schema_type(Type::String))
                .required("message"),
        ))
        .build()
}

/// The document of the API as deployed with sign-in (`OUTBOX_AUTH=jwt`), built once.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    document_for(Authentication::Jwt)
}

/// The document of the API as `authentication` serves it: with sign-in off nobody needs
/// a token, so it states no security scheme and no 401 or 403 (API Gateway's 429 stays:
/// a stage throttles either way).
pub fn document_for(authentication: Authentication) -> &'static utoipa::openapi::OpenApi {
    static SIGNED_IN: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    static OPEN: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    match authentication {
        Authentication::Off => OPEN.get_or_init(|| {
            let mut document = ApiDoc::openapi();
            if let Some(components) = document.components.as_mut() {
                components.security_schemes.clear();
            }
            for item in document.paths.paths.values_mut() {
                for operation in [&mut item.get, &mut item.post, &mut item.put, &mut item.delete] {
                    if let Some(operation) = operation.as_mut() {
                        operation.security = None;
                        operation.responses.responses.remove("401");
                        operation.responses.responses.remove("403");
                    }
                }
            }
            document
        }),
        _ => SIGNED_IN.get_or_init(ApiDoc::openapi),
    }
}

/// `GET /openapi.json`: the document as this service serves requests.
pub async fn openapi_json(
    authentication: Option<Extension<Authentication>>,
) -> Json<&'static utoipa::openapi::OpenApi> {
    let authentication = authentication.map_or(Authentication::Jwt, |Extension(authentication)| authentication);
    Json(document_for(authentication))
}
