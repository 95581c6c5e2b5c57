//! Callers from every front door, and each route's scope checked by the API itself: API
//! Gateway v2 (HTTP API) and v1 (REST API) events as `lambda_http` reads them, whatever
//! path or route key brought them.

use super::*;

use outbox::http::Caller;

/// The API with sign-in required, as on Lambda.
fn signed_in_app() -> TestApp {
    let config = HttpConfig {
        authentication: Authentication::Jwt,
        ..config()
    };
    app_with_config(|backend, clock| backend.request_ports(clock), config)
}

/// An HTTP API (v2) event: `raw_path` as the client sent it, `route_key` as API Gateway
/// matched it, `authorizer` as its authorizer handed it over.
fn http_api(method: Method, raw_path: &str, route_key: &str, authorizer: Value, body: Option<&Value>) -> Request<Body> {
    let mut event: Value = serde_json::from_str(include_str!("../../fixtures/sam_http_api_create_order.json")).unwrap();
    event["rawPath"] = json!(raw_path);
    event["rawQueryString"] = json!("");
    event["queryStringParameters"] = json!({});
    event["routeKey"] = json!(route_key);
    event["requestContext"]["routeKey"] = json!(route_key);
    event["requestContext"]["http"]["method"] = json!(method.as_str());
    event["requestContext"]["http"]["path"] = json!(raw_path);
    event["requestContext"]["authorizer"] = authorizer;
    event["isBase64Encoded"] = json!(false);
    event["body"] = body.map_or(Value::Null, |body| json!(body.to_string()));
    let request = lambda_http::request::from_str(&event.to_string()).expect("an HTTP API event");
    request.map(|body| Body::from(body.to_vec()))
}

/// A REST API (v1) event of stage `$default`'s kind (no stage in the path): `path` as the
/// client sent it, `resource` as API Gateway matched it.
fn rest_api(
    method: Method,
    path: &str,
    resource: &str,
    authorizer: Value,
    identity: Value,
    body: Option<&Value>,
) -> Request<Body> {
    let mut event: Value = serde_json::from_str(include_str!("../../fixtures/sam_rest_api_create_order.json")).unwrap();
    event["path"] = json!(path);
    event["resource"] = json!(resource);
    event["httpMethod"] = json!(method.as_str());
    event["pathParameters"] = Value::Null;
    event["queryStringParameters"] = Value::Null;
    event["multiValueQueryStringParameters"] = Value::Null;
    event["requestContext"]["stage"] = json!("$default");
    event["requestContext"]["path"] = json!(path);
    event["requestContext"]["resourcePath"] = json!(resource);
    event["requestContext"]["httpMethod"] = json!(method.as_str());
    event["requestContext"]["authorizer"] = authorizer;
    if !identity.is_null() {
        event["requestContext"]["identity"] = identity;
    }
    event["body"] = body.map_or(Value::Null, |body| json!(body.to_string()));
    event["isBase64Encoded"] = json!(false);
    let request = lambda_http::request::from_str(&event.to_string()).expect("a REST API event");
    request.map(|body| Body::from(body.to_vec()))
}

fn jwt(subject: &str, scopes: &[&str]) -> Value {
    json!({"jwt": {"claims": {"sub": subject, "iss": ISSUER}, "scopes": scopes}})
}

fn cognito(subject: &str, scope: &str) -> Value {
    json!({"claims": {"sub": subject, "iss": ISSUER, "token_use": "access", "scope": scope}})
}

/// Nothing began and nothing was written: no control message, no record, no order.
fn nothing_written(app: &TestApp, what: &str) {
    assert!(
        app.backend.control_queue.queue().is_empty(),
        "{what}: a control message went out"
    );
    let sizes = app.backend.store.sizes();
    assert_eq!(
        (sizes.business_items, sizes.records),
        (0, 0),
        "{what}: something was written"
    );
}

/// A token with only `orders/read` reaches no write handler, whatever the path's
/// spelling or the route API Gateway matched (its catch-all `$default`, or a REST API's
/// `/{proxy+}`): `lambda_http` resolves `/x/%2e%2e/orders` to `/orders`, so the path is
/// refused before routing, and a plain `/orders` through the catch-all is refused by the
/// route's own scope. Nothing is written; the same event with the write scope places the
/// order.
#[tokio::test]
async fn a_read_token_reaches_no_write_handler_whatever_the_path_or_route() {
    let app = signed_in_app();
    let order = new_order();
    for raw_path in [
        "/x/%2e%2e/orders",
        "/x/../orders",
        "/x/.%2E/orders",
        "/orders/%2e",
        "/orders",
    ] {
        let events = [
            (
                "HTTP API",
                http_api(
                    Method::POST,
                    raw_path,
                    "$default",
                    jwt("reader", &["orders/read"]),
                    Some(&order),
                ),
            ),
            (
                "REST API",
                rest_api(
                    Method::POST,
                    raw_path,
                    "/{proxy+}",
                    cognito("reader", "orders/read"),
                    Value::Null,
                    Some(&order),
                ),
            ),
        ];
        for (door, event) in events {
            let what = format!("{door} POST {raw_path}");
            let reply = app.send(event).await;
            assert!(
                !reply.status.is_success(),
                "{what} reached a write handler: {} {}",
                reply.status,
                reply.body
            );
            let expected = if raw_path == "/orders" {
                (StatusCode::FORBIDDEN, "/problems/insufficient-scope")
            } else {
                (StatusCode::BAD_REQUEST, "/problems/ambiguous-path")
            };
            assert_eq!(
                (reply.status, reply.body["type"].as_str().unwrap_or_default()),
                expected,
                "{what}: {}",
                reply.body
            );
            if reply.status == StatusCode::FORBIDDEN {
                assert_eq!(
                    reply.headers["www-authenticate"], "Bearer error=\"insufficient_scope\", scope=\"orders/write\"",
                    "{what}"
                );
            }
            nothing_written(&app, &what);
        }
    }
    let writer = app
        .send(http_api(
            Method::POST,
            "/orders",
            "POST /orders",
            jwt("writer", &["orders/write"]),
            Some(&order),
        ))
        .await;
    assert_eq!(writer.status, StatusCode::CREATED, "{}", writer.body);
}

/// Every operation of the OpenAPI document is served only to a caller with the scope the
/// document states for it: a caller with every other scope gets 403, one with that scope
/// gets past the check (whatever the handler then answers).
#[tokio::test]
async fn every_route_checks_the_scope_its_openapi_operation_states() {
    let app = signed_in_app();
    let document = app.send(empty(Method::GET, "/openapi.json")).await.body;
    let id = "018bcfe5-6800-7000-8000-000000000000";
    let mut checked = 0;
    for (template, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("operations") {
            let Some(security) = operation["security"].as_array() else {
                continue;
            };
            let scope = security[0]["bearer"][0].as_str().expect("a scope").to_owned();
            let path = template.replace("{id}", id).replace("{sku}", "SKU-1");
            let method: Method = method.to_uppercase().parse().unwrap();
            let body = json!({"sku": "SKU-1", "quantity": 1, "unit_price_cents": 100, "customer_id": "c", "items": []});
            let request = |scopes: Vec<&str>| {
                let mut request = json_request(method.clone(), &path, &body);
                request
                    .extensions_mut()
                    .insert(Caller::new("someone").with_scopes(scopes));
                request
            };
            let others: Vec<&str> = ["orders/read", "orders/write", "other"]
                .into_iter()
                .filter(|other| *other != scope)
                .collect();
            let refused = app.send(request(others)).await;
            assert_eq!(
                refused.status,
                StatusCode::FORBIDDEN,
                "{method} {template} without {scope}: {}",
                refused.body
            );
            assert_eq!(
                refused.body["type"], "/problems/insufficient-scope",
                "{method} {template}"
            );
            let served = app.send(request(vec![scope.as_str()])).await;
            assert_ne!(
                served.status,
                StatusCode::FORBIDDEN,
                "{method} {template} with {scope}: {}",
                served.body
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 6, "every operation but the document's own");
}

/// The caller comes from whichever front door verified it, as issuer and subject: IAM
/// (an assumed role's sessions are one caller; served where API Gateway authorized the
/// route served, refused through a catch-all), a Lambda authorizer's context on an HTTP
/// API and on a REST API, and the same subject of two issuers is two callers who never
/// see each other's orders.
#[tokio::test]
async fn every_front_door_names_its_caller_by_issuer_and_subject() {
    let app = signed_in_app();
    let order = new_order();
    let role = |session: &str| {
        json!({"iam": {"accountId": "111122223333", "callerId": "AROA:x", "userId": "AROA:x",
            "userArn": format!("arn:aws:sts::111122223333:assumed-role/Billing/{session}")}})
    };
    let placed = app
        .send(http_api(
            Method::POST,
            "/orders",
            "POST /orders",
            role("session-1"),
            Some(&order),
        ))
        .await;
    assert_eq!(placed.status, StatusCode::CREATED, "IAM: {}", placed.body);
    let id = placed.body["id"].as_str().unwrap().to_owned();
    let path = format!("/orders/{id}");
    let read = app
        .send(http_api(
            Method::GET,
            &path,
            "GET /orders/{id}",
            role("session-2"),
            None,
        ))
        .await;
    assert_eq!(
        read.status,
        StatusCode::OK,
        "another session of the role is the same caller: {}",
        read.body
    );
    let catch_all = app
        .send(http_api(
            Method::POST,
            "/orders",
            "$default",
            role("session-1"),
            Some(&order),
        ))
        .await;
    assert_eq!(
        catch_all.status,
        StatusCode::FORBIDDEN,
        "IAM authorized no route: {}",
        catch_all.body
    );
    assert_eq!(
        catch_all.body["type"], "/problems/route-not-authorized",
        "{}",
        catch_all.body
    );
    let rest_iam = |resource: &str| {
        rest_api(
            Method::POST,
            "/orders",
            resource,
            json!({}),
            json!({"accountId": "111122223333", "caller": "AROA:x", "sourceIp": "127.0.0.1",
                "userArn": "arn:aws:sts::111122223333:assumed-role/Billing/session-3"}),
            Some(&order),
        )
    };
    assert_eq!(
        app.send(rest_iam("/orders")).await.status,
        StatusCode::CREATED,
        "REST API, IAM on the route"
    );
    assert_eq!(
        app.send(rest_iam("/{proxy+}")).await.status,
        StatusCode::FORBIDDEN,
        "REST API, IAM on a proxy"
    );

    let lambda = json!({"lambda": {"sub": "billing", "scope": "orders/read orders/write"}});
    let placed = app
        .send(http_api(
            Method::POST,
            "/orders",
            "POST /orders",
            lambda.clone(),
            Some(&order),
        ))
        .await;
    assert_eq!(placed.status, StatusCode::CREATED, "Lambda authorizer: {}", placed.body);
    let path = format!("/orders/{}", placed.body["id"].as_str().unwrap());
    let own = app
        .send(http_api(Method::GET, &path, "GET /orders/{id}", lambda, None))
        .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    let same_subject_of_a_token = app
        .send(http_api(
            Method::GET,
            &path,
            "GET /orders/{id}",
            jwt("billing", &["orders/read"]),
            None,
        ))
        .await;
    assert_eq!(
        same_subject_of_a_token.status,
        StatusCode::NOT_FOUND,
        "the issuer's `billing` is not the Lambda authorizer's"
    );
    let rest_lambda = rest_api(
        Method::POST,
        "/orders",
        "/orders",
        json!({"principalId": "shipping", "scope": "orders/write", "integrationLatency": 3}),
        Value::Null,
        Some(&order),
    );
    assert_eq!(
        app.send(rest_lambda).await.status,
        StatusCode::CREATED,
        "REST API, Lambda authorizer"
    );

    let other_issuer = json!({"jwt": {"claims": {"sub": "alice", "iss": "https://other.example"}, "scopes": ["orders/read", "orders/write"]}});
    let alices = app
        .send(signed_in(Some("alice"), Method::POST, "/orders", Some(&order)))
        .await;
    assert_eq!(alices.status, StatusCode::CREATED, "{}", alices.body);
    let path = format!("/orders/{}", alices.body["id"].as_str().unwrap());
    let other = app
        .send(http_api(Method::GET, &path, "GET /orders/{id}", other_issuer, None))
        .await;
    assert_eq!(
        other.status,
        StatusCode::NOT_FOUND,
        "another issuer's alice: {}",
        other.body
    );
}

/// Paths the URL parser rewrites on their way to the router are refused too: tabs and
/// line breaks it drops (`/x/.\t./orders` routes as `/orders`), and a `Host` header that
/// carries a path of its own, which an ALB event's URL is built from (`host:
/// alb.example/orders#` makes `/anything/else` route as `/orders`). Nothing is written.
#[tokio::test]
async fn paths_the_url_parser_rewrites_are_refused() {
    let app = signed_in_app();
    let order = new_order();
    for raw_path in ["/x/.\t./orders", "/x/..\n/orders", "/x/\r../orders"] {
        let reply = app
            .send(http_api(
                Method::POST,
                raw_path,
                "$default",
                jwt("writer", &["orders/write"]),
                Some(&order),
            ))
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{raw_path:?}: {}", reply.body);
        assert_eq!(reply.body["type"], "/problems/ambiguous-path", "{raw_path:?}");
    }
    let mut alb: Value = serde_json::from_str(include_str!("../../fixtures/sam_alb_create_order.json")).unwrap();
    alb["path"] = json!("/anything/else");
    alb["headers"]["host"] = json!("alb.example/orders#");
    alb["headers"].as_object_mut().unwrap().remove("accept-encoding");
    let request = lambda_http::request::from_str(&alb.to_string()).expect("an ALB event");
    assert_eq!(request.uri().path(), "/orders", "the URL the ALB event makes");
    let mut request = request.map(|body| Body::from(body.to_vec()));
    request
        .extensions_mut()
        .insert(Caller::new("writer").with_scopes(["orders/write"]));
    let reply = app.send(request).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert_eq!(reply.body["type"], "/problems/ambiguous-path");
    nothing_written(&app, "rewritten paths");
}

/// Callers of the front doors that share one credential among people are told apart by
/// what the front door verified of each: the users of a Cognito identity pool share its
/// role, and are each their identity. HTTP API events of payload format 1.0 carry their
/// JWT and Lambda authorizers' callers as 2.0 does. A Lambda authorizer's issuer is its
/// own: it never names another front door's caller, and an issuer with white space in
/// it (which would make two pairs one id) names no caller.
#[tokio::test]
async fn identities_behind_shared_credentials_and_every_payload_format_are_callers() {
    let app = signed_in_app();
    let order = new_order();
    let pool_user = |identity: &str| {
        json!({"iam": {"accountId": "111122223333", "callerId": "AROA:CognitoIdentityCredentials",
            "userArn": "arn:aws:sts::111122223333:assumed-role/Cognito_Auth_Role/CognitoIdentityCredentials",
            "cognitoIdentity": {"amr": ["authenticated"], "identityId": identity,
                "identityPoolId": "us-east-1:pool"}}})
    };
    let alices = app
        .send(http_api(
            Method::POST,
            "/orders",
            "POST /orders",
            pool_user("us-east-1:alice"),
            Some(&order),
        ))
        .await;
    assert_eq!(alices.status, StatusCode::CREATED, "{}", alices.body);
    let path = format!("/orders/{}", alices.body["id"].as_str().unwrap());
    let as_bob = app
        .send(http_api(
            Method::GET,
            &path,
            "GET /orders/{id}",
            pool_user("us-east-1:bob"),
            None,
        ))
        .await;
    assert_eq!(
        as_bob.status,
        StatusCode::NOT_FOUND,
        "Bob shares Alice's role, not her orders: {}",
        as_bob.body
    );
    let as_alice = app
        .send(http_api(
            Method::GET,
            &path,
            "GET /orders/{id}",
            pool_user("us-east-1:alice"),
            None,
        ))
        .await;
    assert_eq!(as_alice.status, StatusCode::OK, "{}", as_alice.body);

    // Payload format 1.0: the HTTP API's authorizers under `requestContext.authorizer`.
    let format_1 = |authorizer: Value, method: Method, path: &str, body: Option<&Value>| {
        rest_api(method, path, path, authorizer, Value::Null, body)
    };
    let jwt_1 = json!({"jwt": {"claims": {"sub": "carol", "iss": ISSUER}, "scopes": ["orders/write", "orders/read"]}});
    let placed = app.send(format_1(jwt_1, Method::POST, "/orders", Some(&order))).await;
    assert_eq!(placed.status, StatusCode::CREATED, "JWT, payload 1.0: {}", placed.body);
    let carols = format!("/orders/{}", placed.body["id"].as_str().unwrap());
    let read = app.send(signed_in(Some("carol"), Method::GET, &carols, None)).await;
    assert_eq!(
        read.status,
        StatusCode::OK,
        "payload 1.0's carol is 2.0's: {}",
        read.body
    );
    let lambda_1 = json!({"lambda": {"sub": "dave", "scope": "orders/write"}});
    let placed = app
        .send(format_1(lambda_1, Method::POST, "/orders", Some(&order)))
        .await;
    assert_eq!(
        placed.status,
        StatusCode::CREATED,
        "Lambda authorizer, payload 1.0: {}",
        placed.body
    );

    // A Lambda authorizer that names the issuer of the JWT authorizer's carol is not her.
    let claiming = json!({"lambda": {"sub": "carol", "iss": ISSUER, "scope": "orders/read"}});
    let claimed = app
        .send(http_api(Method::GET, &carols, "GET /orders/{id}", claiming, None))
        .await;
    assert_eq!(claimed.status, StatusCode::NOT_FOUND, "{}", claimed.body);
    let spaced = json!({"jwt": {"claims": {"sub": "carol", "iss": "https://a b"}, "scopes": ["orders/read"]}});
    let refused = app
        .send(http_api(Method::GET, &carols, "GET /orders/{id}", spaced, None))
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);
}
