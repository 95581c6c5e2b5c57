//! The settings' tests: defaults, and each rule naming its variable.

use super::*;

fn settings(pairs: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    Settings::from_lookup(|name| map.get(name).cloned())
}

fn only_error(pairs: &[(&str, &str)]) -> SettingError {
    let errors = settings(pairs).unwrap_err().errors;
    assert_eq!(errors.len(), 1, "{errors:?}");
    errors.into_iter().next().unwrap()
}

#[test]
fn nothing_set_means_embedded_with_the_documented_defaults() {
    let settings = settings(&[]).unwrap();
    assert_eq!(settings.backend, Backend::Embedded);
    assert_eq!(settings.timing.first_check_delay, Duration::from_secs(1));
    assert_eq!(settings.timing.max_commit_duration, Duration::from_secs(30));
    assert_eq!(
        settings.timing.retention, EMBEDDED_RETENTION,
        "a development backend keeps records briefly"
    );
    assert!(settings.destinations.is_empty());
}

#[test]
fn fifo_groups_are_by_entity_unless_chosen_otherwise() {
    assert_eq!(settings(&[]).unwrap().fifo_groups, FifoGrouping::Entity);
    for (value, chosen) in [
        ("entity", FifoGrouping::Entity),
        ("transaction", FifoGrouping::Transaction),
    ] {
        assert_eq!(
            settings(&[(vars::FIFO_GROUPS, value)]).unwrap().fifo_groups,
            chosen,
            "{value}"
        );
    }
    let error = only_error(&[(vars::FIFO_GROUPS, "order")]);
    assert_eq!(error.variable, vars::FIFO_GROUPS);
    assert!(error.problem.contains("entity or transaction"), "{error}");
}

#[test]
fn callers_must_sign_in_on_lambda_unless_chosen_otherwise() {
    assert_eq!(settings(&[]).unwrap().authentication, Authentication::Off, "locally");
    let lambda = [
        ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
        (vars::BACKEND, "aws"),
        (vars::TABLE_NAME, "t"),
        (vars::CONTROL_QUEUE_URL, "https://sqs.us-east-1.amazonaws.com/1/c"),
    ];
    assert_eq!(
        settings(&lambda).unwrap().authentication,
        Authentication::Jwt,
        "on Lambda"
    );
    for (value, chosen) in [("jwt", Authentication::Jwt), ("off", Authentication::Off)] {
        let mut pairs = lambda.to_vec();
        pairs.push((vars::AUTH, value));
        // Off on Lambda only where the operator says so explicitly.
        pairs.push((vars::AUTH_OFF_EXPOSED, "allow"));
        assert_eq!(settings(&pairs).unwrap().authentication, chosen, "{value}");
        assert_eq!(
            settings(&[(vars::AUTH, value)]).unwrap().authentication,
            chosen,
            "{value}"
        );
        assert_eq!(chosen.as_str(), value);
    }
    let error = only_error(&[(vars::AUTH, "none")]);
    assert_eq!(error.variable, vars::AUTH);
    assert!(error.problem.contains("jwt or off"), "{error}");
}

#[test]
fn sign_in_off_on_lambda_is_refused_unless_the_operator_says_so() {
    let lambda = [
        ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
        (vars::BACKEND, "aws"),
        (vars::TABLE_NAME, "t"),
        (vars::CONTROL_QUEUE_URL, "https://sqs.us-east-1.amazonaws.com/1/c"),
        (vars::AUTH, "off"),
    ];
    let error = only_error(&lambda);
    assert_eq!(error.variable, vars::AUTH);
    assert!(
        error.problem.contains("development caller") && error.problem.contains(vars::AUTH_OFF_EXPOSED),
        "{error}"
    );
    let mut wrong = lambda.to_vec();
    wrong.push((vars::AUTH_OFF_EXPOSED, "yes"));
    let errors = settings(&wrong).unwrap_err().errors;
    assert!(
        errors
            .iter()
            .any(|error| error.variable == vars::AUTH_OFF_EXPOSED && error.problem.contains("allow")),
        "{errors:?}"
    );
    // Off Lambda, sign-in off needs no word of the operator's on loopback, where nobody
    // else reaches it; beyond loopback it does.
    let local = settings(&[(vars::AUTH, "off")]).unwrap();
    assert_eq!(local.authentication, Authentication::Off);
    assert!(local.check_listen_address("127.0.0.1:3000".parse().unwrap()).is_ok());
    assert!(local.check_listen_address("[::1]:3000".parse().unwrap()).is_ok());
    let exposed = local.check_listen_address("0.0.0.0:3000".parse().unwrap()).unwrap_err();
    assert!(exposed.problem.contains(vars::AUTH_OFF_EXPOSED), "{exposed}");
    let allowed = settings(&[(vars::AUTH, "off"), (vars::AUTH_OFF_EXPOSED, "allow")]).unwrap();
    assert!(allowed.check_listen_address("0.0.0.0:3000".parse().unwrap()).is_ok());
    let signed_in = settings(&[(vars::AUTH, "jwt")]).unwrap();
    assert!(signed_in.check_listen_address("0.0.0.0:3000".parse().unwrap()).is_ok());
}

#[test]
fn inline_publishing_is_after_the_answer_unless_chosen_otherwise() {
    assert_eq!(settings(&[]).unwrap().inline_publish, InlinePublish::AfterAnswer);
    for (value, chosen) in [
        ("after", InlinePublish::AfterAnswer),
        ("before", InlinePublish::BeforeAnswer),
        ("off", InlinePublish::Off),
        // The values of the earlier on/off flag keep their meaning.
        ("true", InlinePublish::BeforeAnswer),
        ("false", InlinePublish::Off),
    ] {
        assert_eq!(
            settings(&[(vars::INLINE_PUBLISH, value)]).unwrap().inline_publish,
            chosen,
            "{value}"
        );
    }
    let error = only_error(&[(vars::INLINE_PUBLISH, "later")]);
    assert_eq!(error.variable, vars::INLINE_PUBLISH);
    assert!(error.problem.contains("after, before or off"), "{error}");
}

#[test]
fn metrics_are_counted_under_the_service_named_or_the_executable() {
    assert_eq!(settings(&[(vars::SERVICE_NAME, "shop")]).unwrap().service_name, "shop");
    // The unit tests' executable is `outbox-<hash>`: never the API's name.
    let default = settings(&[]).unwrap().service_name;
    assert!(default.starts_with("outbox"), "{default}");
    assert_eq!(settings(&[(vars::SERVICE_NAME, " ")]).unwrap().service_name, default);
}

#[test]
fn inside_lambda_the_embedded_backend_is_refused_naming_the_variable() {
    for backend in [None, Some("embedded")] {
        let mut pairs = vec![("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001")];
        pairs.extend(backend.map(|backend| (vars::BACKEND, backend)));
        let error = only_error(&pairs);
        assert_eq!(error.variable, vars::BACKEND);
        assert!(error.problem.contains("must be `aws` inside AWS Lambda"), "{error:?}");
    }
    let aws = settings(&[
        ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
        (vars::BACKEND, "aws"),
        (vars::TABLE_NAME, "t"),
        (vars::CONTROL_QUEUE_URL, "https://sqs.us-east-1.amazonaws.com/1/c"),
    ]);
    assert!(aws.is_ok(), "{aws:?}");
    assert_eq!(
        aws.unwrap().timing.retention,
        Duration::from_secs(604_800),
        "seven days on AWS"
    );
}

#[test]
fn the_aws_backend_needs_its_table_and_queue() {
    let errors = settings(&[(vars::BACKEND, "aws")]).unwrap_err().errors;
    let named: Vec<_> = errors.iter().map(|e| e.variable.as_str()).collect();
    assert_eq!(named, [vars::TABLE_NAME, vars::CONTROL_QUEUE_URL]);
    let ok = settings(&[
        (vars::BACKEND, "aws"),
        (vars::TABLE_NAME, "outbox"),
        (vars::CONTROL_QUEUE_URL, "http://localhost/q"),
        (
            vars::DESTINATIONS,
            "events=http://localhost/events, audit = http://localhost/audit.fifo",
        ),
    ])
    .unwrap();
    assert_eq!(
        ok.backend,
        Backend::Aws {
            layout: TableLayout::dedicated("outbox"),
            control_queue_url: "http://localhost/q".into(),
            write_region: None,
        }
    );
    assert_eq!(ok.destinations.len(), 2);
    assert_eq!(
        ok.destinations[&"audit".parse().unwrap()],
        Target::SqsQueue {
            url: "http://localhost/audit.fifo".into(),
            fifo: true
        }
    );
    // The new form, kind stated; a FIFO queue must say so.
    let aws = [
        (vars::BACKEND, "aws"),
        (vars::TABLE_NAME, "outbox"),
        (vars::CONTROL_QUEUE_URL, "http://localhost/q"),
    ];
    let with = |destinations: &str| {
        let pairs: Vec<(&str, &str)> = aws
            .iter()
            .copied()
            .chain([(vars::DESTINATIONS, destinations)])
            .collect();
        settings(&pairs)
    };
    let new_form = with("events=sqs:http://localhost/events,audit=sqs-fifo:http://localhost/audit.fifo").unwrap();
    assert_eq!(new_form.destinations, ok.destinations);
    let every_kind = with(
        "queue=sqs:http://localhost/events, topic=sns-fifo:arn:aws:sns:us-east-1:123456789012:t.fifo, bus=eventbridge:orders",
    )
    .unwrap();
    let written: Vec<String> = every_kind
        .destinations
        .iter()
        .map(|(name, target)| format!("{name}={target}"))
        .collect();
    assert_eq!(
        written,
        [
            "bus=eventbridge:orders",
            "queue=sqs:http://localhost/events",
            "topic=sns-fifo:arn:aws:sns:us-east-1:123456789012:t.fifo"
        ]
    );
    for (entry, says) in [
        ("audit=sqs:http://localhost/audit.fifo", "takes the -fifo kind"),
        (
            "events=sns:arn:aws:sns:us-east-1:123456789012:events.fifo",
            "takes the -fifo kind",
        ),
        ("events=eventbridge:", "names no target"),
        ("events=kafka:x", "unknown destination kind"),
        ("events", "each entry must be name=kind:target"),
    ] {
        let errors = with(entry).unwrap_err().errors;
        assert_eq!(errors.len(), 1, "{entry}: {errors:?}");
        assert_eq!(errors[0].variable, vars::DESTINATIONS);
        assert!(errors[0].to_string().contains(says), "{entry}: {}", errors[0]);
    }
}

#[test]
fn the_protocol_records_go_where_the_layout_says() {
    let aws = [
        (vars::BACKEND, "aws"),
        (vars::TABLE_NAME, "shop"),
        (vars::CONTROL_QUEUE_URL, "http://localhost/q"),
    ];
    let layout = |extra: &[(&str, &str)]| {
        let pairs: Vec<(&str, &str)> = aws.iter().chain(extra).copied().collect();
        settings(&pairs).map(|settings| match settings.backend {
            Backend::Aws { layout, .. } => layout,
            Backend::Embedded => unreachable!("the aws backend was asked for"),
        })
    };
    assert_eq!(
        layout(&[
            (vars::PARTITION_KEY, "PK"),
            (vars::SORT_KEY, "SK"),
            (vars::TTL_ATTRIBUTE, "ttl")
        ])
        .unwrap(),
        TableLayout::dedicated("shop")
            .with_partition_key("PK")
            .with_sort_key("SK", SortKeyValue::SameAsPartitionKey)
            .with_ttl_attribute("ttl")
    );
    assert_eq!(
        layout(&[(vars::SORT_KEY, "SK"), (vars::SORT_KEY_VALUE, "OUTBOX")]).unwrap(),
        TableLayout::dedicated("shop").with_sort_key("SK", SortKeyValue::Constant("OUTBOX".into()))
    );
    let errors = layout(&[(vars::SORT_KEY_VALUE, "OUTBOX")]).unwrap_err().errors;
    assert_eq!(errors[0].variable, vars::SORT_KEY_VALUE);
    let errors = layout(&[(vars::PARTITION_KEY, "state")]).unwrap_err().errors;
    assert!(errors[0].variable.contains(vars::PARTITION_KEY), "{errors:?}");
    assert!(errors[0].problem.contains("\"state\""), "{errors:?}");
}

#[test]
fn each_bad_value_names_its_variable_and_rule() {
    let error = only_error(&[(vars::FIRST_CHECK_DELAY_SECONDS, "901")]);
    assert_eq!(error.variable, vars::FIRST_CHECK_DELAY_SECONDS);
    assert!(error.problem.contains("0 to 900"), "{error}");
    assert_eq!(only_error(&[(vars::BACKEND, "gcp")]).variable, vars::BACKEND);
    assert_eq!(
        only_error(&[(vars::MAX_MESSAGES_PER_TRANSACTION, "many")]).variable,
        vars::MAX_MESSAGES_PER_TRANSACTION
    );
    assert_eq!(
        only_error(&[(vars::DESTINATIONS, "events")]).variable,
        vars::DESTINATIONS
    );
    assert_eq!(
        only_error(&[(vars::DESTINATIONS, "bad name=http://x")]).variable,
        vars::DESTINATIONS
    );
    assert_eq!(
        only_error(&[(vars::DESTINATIONS, "a=http://x,a=http://y")]).variable,
        vars::DESTINATIONS
    );
}

#[test]
fn the_commit_window_must_outlast_the_api_and_sdk_timeouts() {
    let error = only_error(&[
        (vars::MAX_COMMIT_DURATION_SECONDS, "15"),
        (vars::API_TIMEOUT_SECONDS, "10"),
        (vars::SDK_OPERATION_TIMEOUT_SECONDS, "5"),
    ]);
    assert!(error.variable.contains(vars::MAX_COMMIT_DURATION_SECONDS), "{error}");
    assert!(error.problem.contains("must exceed"), "{error}");
    assert!(settings(&[(vars::MAX_COMMIT_DURATION_SECONDS, "16")]).is_ok());
}

#[test]
fn inconsistent_backoff_and_retention_are_refused() {
    assert!(only_error(&[
        (vars::FIRST_CHECK_DELAY_SECONDS, "20"),
        (vars::BACKOFF_CAP_SECONDS, "10")
    ])
    .variable
    .contains(vars::BACKOFF_CAP_SECONDS));
    assert!(only_error(&[
        (vars::RETENTION_SECONDS, "3600"),
        (vars::MAX_COMMIT_DURATION_SECONDS, "3600")
    ])
    .variable
    .contains(vars::RETENTION_SECONDS));
}

/// On AWS a tombstone record outlives every request of its transaction that AWS may still
/// take (the window plus 15 minutes); the embedded backend, which no request reaches late,
/// keeps its short default.
#[test]
fn on_aws_the_retention_outlives_a_late_signed_request() {
    let aws = |retention: &str| {
        settings(&[
            (vars::BACKEND, "aws"),
            (vars::TABLE_NAME, "t"),
            (vars::CONTROL_QUEUE_URL, "https://sqs.us-east-1.amazonaws.com/1/q"),
            (vars::RETENTION_SECONDS, retention),
            (vars::MAX_COMMIT_DURATION_SECONDS, "30"),
        ])
    };
    let error = aws("900").unwrap_err();
    assert!(
        error.to_string().contains("how long AWS takes a signed request"),
        "{error}"
    );
    assert!(aws("931").is_ok());
    assert!(settings(&[(vars::RETENTION_SECONDS, "60")]).is_ok(), "embedded");
}

#[test]
fn all_problems_are_reported_at_once() {
    let errors = settings(&[(vars::BACKEND, "aws"), (vars::RETENTION_SECONDS, "x")]).unwrap_err();
    assert_eq!(errors.errors.len(), 3);
    assert!(errors.to_string().starts_with("invalid settings: "));
}

/// The guide's table of settings (docs/GUIDE.md, "Settings") names every variable the
/// settings read, and nothing they do not, besides the few other parts of the library
/// read (the local server's address, metrics off Lambda, logging, tracing).
#[test]
fn the_guides_settings_table_lists_every_variable_the_settings_read() {
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/GUIDE.md")).expect("docs/GUIDE.md");
    let table = guide
        .split("\n## Settings\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Settings section");
    let listed: std::collections::BTreeSet<String> = table
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|line| line.split('`').next())
        .map(str::to_owned)
        .collect();
    let read = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let _ = Settings::from_lookup(|name| {
        read.lock().unwrap().insert(name.to_owned());
        match name {
            vars::BACKEND => Some("aws".to_owned()),
            vars::TABLE_NAME => Some("t".to_owned()),
            _ => None,
        }
    });
    let mut read = read.into_inner().unwrap();
    // Lambda's own, which the settings look at but nobody sets.
    read.retain(|name| !name.starts_with("AWS_LAMBDA_"));
    assert!(read.len() >= 15, "the recorder saw too little: {read:?}");
    let missing: Vec<&String> = read.difference(&listed).collect();
    assert!(missing.is_empty(), "read but not in the guide's table: {missing:?}");
    let elsewhere = [
        "OUTBOX_LISTEN_ADDR",
        "OUTBOX_EMF",
        "RUST_LOG",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ];
    let unknown: Vec<&String> = listed
        .difference(&read)
        .filter(|name| !elsewhere.contains(&name.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "in the guide's table but read by nothing: {unknown:?}"
    );
}

/// `OUTBOX_WRITE_REGION` names the one Region that writes a replicated table: read with
/// the `aws` backend, a Region's name or nothing.
#[test]
fn the_write_region_is_a_regions_name_or_unset() {
    let aws = [
        (vars::BACKEND, "aws"),
        (vars::TABLE_NAME, "outbox"),
        (vars::CONTROL_QUEUE_URL, "http://localhost/q"),
    ];
    let with = |region: Option<&str>| {
        let mut pairs = aws.to_vec();
        pairs.extend(region.map(|region| (vars::WRITE_REGION, region)));
        settings(&pairs)
    };
    let region_of = |settings: Settings| match settings.backend {
        Backend::Aws { write_region, .. } => write_region,
        Backend::Embedded => unreachable!("the aws backend was asked for"),
    };
    assert_eq!(region_of(with(None).unwrap()), None);
    assert_eq!(
        region_of(with(Some(" eu-west-1 ")).unwrap()).as_deref(),
        Some("eu-west-1")
    );
    for wrong in ["US-EAST-1", "us_east_1", "useast", "us-east-1,eu-west-1"] {
        let errors = with(Some(wrong)).unwrap_err().errors;
        assert_eq!(errors.len(), 1, "{wrong}: {errors:?}");
        assert_eq!(errors[0].variable, vars::WRITE_REGION);
        assert!(errors[0].problem.contains("such as us-east-1"), "{}", errors[0]);
    }
}

/// The first pause before a conflicting step runs again: 10 ms unless set, in
/// milliseconds from 1 to 1000.
#[test]
fn the_conflict_retry_pause_is_milliseconds_within_bounds() {
    assert_eq!(settings(&[]).unwrap().conflict_retry_pause, Duration::from_millis(10));
    assert_eq!(
        settings(&[(vars::CONFLICT_RETRY_PAUSE_MS, "40")])
            .unwrap()
            .conflict_retry_pause,
        Duration::from_millis(40)
    );
    for wrong in ["0", "1001", "x"] {
        let error = only_error(&[(vars::CONFLICT_RETRY_PAUSE_MS, wrong)]);
        assert_eq!(error.variable, vars::CONFLICT_RETRY_PAUSE_MS, "{wrong}");
    }
}
