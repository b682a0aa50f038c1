//! Host functions and completions given as a function and context words
//! ([`Op::raw_host_fn`], [`MockStream::enqueue_raw`]): the rules of their
//! boxed forms, without the box.
//!
//! A plain function captures nothing, so these report through [`CALLS`];
//! every test tags its calls with its own first context word.

use flex_rt::{Result, Status, Stream};
use parking_lot::Mutex;

use super::*;
use crate::raw_call::{RawCompletion, RawContext, RawHostFn};

/// `(tag, what happened)` for every call of [`host`] and [`completion`].
static CALLS: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());

/// What [`host`] does: `[tag, n, OK]` returns `Ok`, `[tag, n, ERR]` an
/// error, `[tag, n, PANIC]` panics.
const OK: usize = 0;
const ERR: usize = 1;
const PANIC: usize = 2;

fn host([tag, n, action]: RawContext) -> std::result::Result<(), String> {
    CALLS.lock().push((tag, format!("host {n}")));
    match action {
        OK => Ok(()),
        ERR => Err("refused by the host".into()),
        _ => panic!("the host function {n} panicked"),
    }
}

fn completion([tag, n, _]: RawContext, result: Result<()>) {
    let outcome = match result {
        Ok(()) => "ok".to_string(),
        Err(err) => format!("{}: {}", err.status(), err.message()),
    };
    CALLS
        .lock()
        .push((tag, format!("completion {n} {outcome}")));
}

/// The calls made for `tag`, in order.
fn calls(tag: usize) -> Vec<String> {
    CALLS
        .lock()
        .iter()
        .filter(|(t, _)| *t == tag)
        .map(|(_, call)| call.clone())
        .collect()
}

/// Launches host function `n` of `tag`, with its completion.
fn launch(stream: &MockStream, tag: usize, n: usize, action: usize) -> Result<()> {
    stream.enqueue_raw(
        Op::raw_host_fn(RawHostFn::new(host, [tag, n, action])),
        Some(RawCompletion::new(completion, [tag, n, action])),
    )
}

#[test]
fn raw_host_functions_and_completions_run_once_each_in_stream_order() {
    const TAG: usize = 1;
    let rt = runtime(2);
    let s = stream(&rt);
    for n in 0..3 {
        launch(s, TAG, n, OK).unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(
        calls(TAG),
        [
            "host 0",
            "completion 0 ok",
            "host 1",
            "completion 1 ok",
            "host 2",
            "completion 2 ok"
        ]
    );
}

#[test]
fn a_raw_host_function_error_fails_the_stream_and_later_launches_are_refused_uncalled() {
    const TAG: usize = 2;
    let rt = runtime(1);
    let s = stream(&rt);
    launch(s, TAG, 0, ERR).unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
    assert_eq!(err.call(), "launch_host_callback");
    assert!(
        err.message()
            .contains("host callback returned an error: refused by the host"),
        "{err}"
    );
    let refused = launch(s, TAG, 1, OK).unwrap_err();
    assert_eq!(refused.status(), Status::STREAM_FAILED);
    // The failed operation's completion got the error; the refused launch's
    // host function and completion were never called.
    let calls = calls(TAG);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0], "host 0");
    assert!(
        calls[1].starts_with("completion 0 FLEX_ERROR_HOST_CALLBACK_FAILED (10): ")
            && calls[1].contains("refused by the host"),
        "{calls:?}"
    );
}

#[test]
fn a_panicking_raw_host_function_fails_the_stream_not_the_engine() {
    const TAG: usize = 3;
    let rt = runtime(1);
    let s = stream(&rt);
    launch(s, TAG, 0, PANIC).unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
    assert!(
        err.message()
            .contains("host callback panicked: the host function 0 panicked"),
        "{err}"
    );
    let other = stream(&rt);
    launch(other, TAG, 1, OK).unwrap();
    other.synchronize().unwrap();
    let calls = calls(TAG);
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(
        calls[1].starts_with("completion 0 FLEX_ERROR_HOST_CALLBACK_FAILED (10): "),
        "{calls:?}"
    );
    assert_eq!(calls[2..], ["host 1", "completion 1 ok"]);
}

#[test]
fn raw_and_boxed_completions_keep_their_stream_order() {
    const TAG: usize = 4;
    let rt = runtime(2);
    let s = stream(&rt);
    launch(s, TAG, 0, OK).unwrap();
    s.enqueue(
        Op::host_fn(|| Ok(())),
        LaunchOptions::new().on_complete(|result| {
            assert!(result.is_ok());
            CALLS.lock().push((TAG, "boxed completion".into()));
        }),
    )
    .unwrap();
    launch(s, TAG, 1, OK).unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        calls(TAG),
        [
            "host 0",
            "completion 0 ok",
            "boxed completion",
            "host 1",
            "completion 1 ok"
        ]
    );
}
