//! `testbed plan` end to end: the binary on a small JSON file, and an error for a bad field.

use std::path::PathBuf;
use std::process::Command;

fn testbed() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_testbed"))
}

const INPUT: &str = r#"{"capacity": {"cpu_millis": 100000, "memory_mib": 102400}, "step_ms": 60000,
 "algorithm": "lowcost", "allocate_left": false,
 "existing": [{"start_ms": 0, "end_ms": 60000, "cpu_millis": 10000, "memory_mib": 10240}],
 "operations": [
   {"op": "reserve", "id": "r1", "arrival_ms": 300000, "deadline_ms": 1200000,
    "interpreter": "all", "recurrence_ms": null,
    "stages": [{"containers": 10, "gang": 5, "duration_ms": 600000,
                "size": {"cpu_millis": 2000, "memory_mib": 2048}}]},
   {"op": "reserve", "id": "big", "arrival_ms": 0, "deadline_ms": 600000,
    "interpreter": "any", "recurrence_ms": null,
    "stages": [{"containers": 60, "gang": 60, "duration_ms": 600000,
                "size": {"cpu_millis": 2000, "memory_mib": 2048}}]},
   {"op": "update", "id": "r1", "arrival_ms": 0, "deadline_ms": 1200000,
    "interpreter": "order_no_gap", "recurrence_ms": 1200000,
    "stages": [{"containers": 10, "gang": 10, "duration_ms": 300000,
                "size": {"cpu_millis": 2000, "memory_mib": 2048}},
               {"containers": 5, "gang": 5, "duration_ms": 540000,
                "size": {"cpu_millis": 2000, "memory_mib": 2048}}]},
   {"op": "delete", "id": "r1"},
   {"op": "delete", "id": "r1"}]}"#;

fn run(input: &str, name: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, input).unwrap();
    Command::new(testbed())
        .args(["plan", "--input", path.to_str().unwrap(), "--json"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

#[test]
fn plan_places_updates_and_deletes() {
    let out = run(INPUT, "plan.json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(v["placement_us"].as_array().unwrap().len(), 5);
    // Window [5, 20) steps, 10-step stage: the only aligned interval is [10, 20); two gangs of 5
    // containers of 2 cores and 2 GiB.
    assert_eq!(
        results[0],
        serde_json::json!({"id": "r1", "op": "reserve", "accepted": true, "allocation": [
            {"start_ms": 600000, "end_ms": 1200000, "cpu_millis": 20000, "memory_mib": 20480}]})
    );
    // 120 cores in one gang never fit 100.
    assert_eq!(results[1]["accepted"], false);
    assert!(
        results[1]["reason"].as_str().unwrap().contains("stage 0"),
        "{}",
        results[1]
    );
    // Every 20 minutes, ORDER_NO_GAP: the last stage (5 × 9 min) ends at the period's end, the
    // first (10 × 5 min) right before it, [6, 11) — repeated in each of the 72 periods.
    let alloc = results[2]["allocation"].as_array().unwrap();
    assert_eq!(results[2]["accepted"], true);
    assert_eq!(alloc.len(), 2 * 72);
    assert_eq!(
        alloc[0],
        serde_json::json!({"start_ms": 360000, "end_ms": 660000, "cpu_millis": 20000, "memory_mib": 20480})
    );
    assert_eq!(
        alloc[1],
        serde_json::json!({"start_ms": 660000, "end_ms": 1200000, "cpu_millis": 10000, "memory_mib": 10240})
    );
    assert_eq!(alloc[2]["start_ms"], 1200000 + 360000);
    assert_eq!(
        results[3],
        serde_json::json!({"id": "r1", "op": "delete", "accepted": true, "allocation": []})
    );
    assert_eq!(results[4]["accepted"], false);
}

#[test]
fn plan_rejects_bad_fields() {
    let out = run(&INPUT.replace("\"gang\": 5,", "\"gangs\": 5,"), "bad.json");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field `gangs`"), "{err}");
    let out = run(&INPUT.replace("\"gang\": 5,", "\"gang\": 3,"), "bad2.json");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("operations[0].stages[0].containers"), "{err}");
    let out = run(
        &INPUT.replace("\"step_ms\": 60000", "\"step_ms\": 0"),
        "bad3.json",
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("step_ms"));
    let out = run(&INPUT.replace("\"all\"", "\"every\""), "bad4.json");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown variant `every`"));
}

/// Errors from reading the JSON name the field by its path, not by a line and column only.
#[test]
fn bad_values_are_named_by_their_path() {
    let cases = [
        (
            INPUT.replace(
                "\"containers\": 10, \"gang\": 5",
                "\"containers\": -1, \"gang\": 5",
            ),
            "operations[0].stages[0].containers: invalid value: integer `-1`",
        ),
        (
            INPUT.replace("\"lowcost\"", "\"best\""),
            "algorithm: unknown variant `best`",
        ),
        (
            INPUT.replace("\"any\"", "\"sometimes\""),
            "operations[1].interpreter: unknown variant `sometimes`",
        ),
        (
            INPUT.replace("\"memory_mib\": 10240}]", "\"memory_mib\": \"lots\"}]"),
            "existing[0].memory_mib: invalid type",
        ),
        (
            INPUT.replace(
                "{\"op\": \"delete\", \"id\": \"r1\"},",
                "{\"op\": \"drop\", \"id\": \"r1\"},",
            ),
            "operations[3].op: unknown operation `drop`",
        ),
        (
            INPUT.replace(
                "{\"op\": \"delete\", \"id\": \"r1\"},",
                "{\"op\": \"delete\", \"id\": \"r1\", \"why\": 1},",
            ),
            "operations[3].why: unknown field `why`",
        ),
        (
            INPUT.replace("{\"op\": \"delete\", \"id\": \"r1\"},", "{\"id\": \"r1\"},"),
            "operations[3]: missing field `op`",
        ),
    ];
    for (i, (input, want)) in cases.iter().enumerate() {
        assert_ne!(input, INPUT, "case {i} must change the input");
        let out = run(input, "bad.json");
        assert!(!out.status.success(), "case {i}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "case {i}: want {want:?} in {err}");
    }
}
