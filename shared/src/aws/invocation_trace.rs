//! The X-Ray trace header of the Lambda invocation being served, per invocation: set by
//! the runtime loops around each invocation ([`InvocationTrace::scope`], a tokio
//! task-local, as [`crate::request::after_answer::Invocation`] is), and read by the SQS
//! adapter for a control message that carries no trace context of its own.
//!
//! Lambda gives each invocation its trace header (`Lambda-Runtime-Trace-Id`,
//! `lambda_runtime::Context::xray_trace_id`). `lambda_runtime` copies it into the
//! process-wide `_X_AMZN_TRACE_ID` only where it runs one invocation at a time; on Lambda
//! Managed Instances, several invocations run in one process at once and the variable is
//! not set per invocation: a send that read it would carry whatever it holds, or another
//! invocation's header. So a send in an invocation's scope carries that invocation's
//! header (none where it had none), and only outside any scope, where one invocation runs
//! at a time, the variable's.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// The environment variable in which Lambda passes the X-Ray trace header to a process
/// that runs one invocation at a time.
pub const TRACE_HEADER_VAR: &str = "_X_AMZN_TRACE_ID";

/// Lambda's variable saying how many invocations one environment runs at once (Lambda
/// Managed Instances; unset or 1 elsewhere).
const MAX_CONCURRENCY_VAR: &str = "AWS_LAMBDA_MAX_CONCURRENCY";

tokio::task_local! {
    static CURRENT: InvocationTrace;
}

/// The trace header Lambda gave one invocation, if it gave one.
#[derive(Clone, PartialEq, Eq)]
pub struct InvocationTrace(Option<Arc<str>>);

impl InvocationTrace {
    /// The invocation whose trace header is `header` (`Context::xray_trace_id`); an empty
    /// one counts as none.
    pub fn new(header: Option<&str>) -> Self {
        Self(header.filter(|header| !header.is_empty()).map(Arc::from))
    }

    /// Its header.
    pub fn header(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// Runs `future` in this invocation's scope: the SQS adapter's sends within it carry
    /// this header. Tasks spawned from it are outside the scope.
    pub fn scope<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, future)
    }

    /// Runs `f` in this invocation's scope: for the work a handler does before its future
    /// is first polled.
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(self, f)
    }

    /// The invocation whose scope this code runs in, if any.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }
}

impl fmt::Debug for InvocationTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("InvocationTrace").field(&self.header()).finish()
    }
}

/// The X-Ray header a send made now carries when its message has no trace context of its
/// own: the current invocation's ([`InvocationTrace::scope`]); outside any invocation's
/// scope, `_X_AMZN_TRACE_ID` where this environment runs one invocation at a time, and
/// none where it runs several (the variable is then no invocation's own).
pub fn header_for_send() -> Option<String> {
    if let Some(invocation) = InvocationTrace::current() {
        return invocation.header().map(str::to_owned);
    }
    if runs_several_at_once(std::env::var(MAX_CONCURRENCY_VAR).ok().as_deref()) {
        return None;
    }
    std::env::var(TRACE_HEADER_VAR).ok().filter(|header| !header.is_empty())
}

/// Whether `AWS_LAMBDA_MAX_CONCURRENCY` (its value, if set) lets several invocations run
/// in this environment at once (the rule `lambda_runtime::run_concurrent` follows).
fn runs_several_at_once(max_concurrency: Option<&str>) -> bool {
    max_concurrency
        .and_then(|value| value.trim().parse::<u32>().ok())
        .is_some_and(|concurrency| concurrency > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two invocations in flight at once, each in its own scope, each reading after the
    /// other has entered its own: each reads its own header, and one without a header
    /// reads none (not the process's variable).
    #[tokio::test]
    async fn each_invocation_reads_its_own_header_while_others_run() {
        let barrier = Arc::new(tokio::sync::Barrier::new(3));
        let read = |header: Option<&'static str>| {
            let barrier = barrier.clone();
            tokio::spawn(InvocationTrace::new(header).scope(async move {
                barrier.wait().await;
                tokio::task::yield_now().await;
                header_for_send()
            }))
        };
        let (first, second, none) = (read(Some("Root=1-a")), read(Some("Root=1-b")), read(None));
        assert_eq!(first.await.unwrap().as_deref(), Some("Root=1-a"));
        assert_eq!(second.await.unwrap().as_deref(), Some("Root=1-b"));
        assert_eq!(none.await.unwrap(), None);
        assert!(InvocationTrace::current().is_none(), "the scope ends with its future");
        assert_eq!(InvocationTrace::new(Some("")).header(), None);
    }

    #[test]
    fn the_variable_is_an_invocations_own_only_where_one_runs_at_a_time() {
        for (value, several) in [
            (None, false),
            (Some("1"), false),
            (Some(" 4 "), true),
            (Some("x"), false),
        ] {
            assert_eq!(runs_several_at_once(value), several, "{value:?}");
        }
    }
}
