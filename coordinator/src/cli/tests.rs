use super::*;

#[test]
fn tail_keeps_the_last_lines_with_or_without_a_final_newline() {
    assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
    assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
    assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
    assert_eq!(last_lines(b"a\nb\n", 0), b"");
    assert_eq!(last_lines(b"", 3), b"");
    let cli = Cli::try_parse_from([
        "govctl", "submit", "--name", "t", "--log", "/l", "--finish", "5:0.001", "--", "x",
    ])
    .unwrap();
    assert!(
        matches!(cli.command, Command::Submit(ref a) if a.finish.as_deref() == Some("5:0.001"))
    );
    assert!(
        Cli::try_parse_from([
            "govctl", "submit", "--name", "t", "--log", "/l", "--finish", "0", "--", "x"
        ])
        .is_err()
    );
    let cli = Cli::try_parse_from([
        "govctl", "submit", "--name", "t", "--log", "/l", "--sweep", "lr", "--", "x",
    ])
    .unwrap();
    assert!(
        matches!(cli.command, Command::Submit(ref a) if a.sweep.as_deref() == Some("lr:3:5")),
        "the sweep is passed on in its one spelling"
    );
    assert!(
        Cli::try_parse_from([
            "govctl", "submit", "--name", "t", "--log", "/l", "--sweep", "lr:1:5", "--", "x"
        ])
        .is_err()
    );
    let cli = Cli::try_parse_from(["govctl", "logs", "-f", "--tail", "20", "j3"]).unwrap();
    assert!(matches!(
        cli.command,
        Command::Logs { ref job, follow: true, tail: Some(20), replica: 0 } if job == "j3"
    ));
}

#[test]
fn move_is_the_verb_and_migrate_its_old_name() {
    for verb in ["move", "migrate"] {
        let cli = Cli::try_parse_from(["govctl", verb, "j3", "--to", "node2"]).unwrap();
        assert!(
            matches!(cli.command, Command::Move { ref job, to: Some(ref to) } if job == "j3" && to == "node2"),
            "govctl {verb}"
        );
    }
}

#[test]
fn submit_parses_the_issue_syntax() {
    let cli = Cli::try_parse_from([
        "govctl",
        "--insecure",
        "submit",
        "--name",
        "bert",
        "--gpus",
        "2",
        "--priority",
        "-1",
        "--memory",
        "1.5G",
        "--env",
        "A=b=c",
        "--log",
        "/tmp/b.log",
        "--",
        "python3",
        "-u",
        "train.py",
    ])
    .unwrap();
    let Command::Submit(a) = cli.command else {
        panic!("not submit")
    };
    assert_eq!(a.command, ["python3", "-u", "train.py"]);
    assert_eq!((a.gpus, a.priority), (2, -1));
    assert_eq!(a.memory, Some(3 << 29));
    assert_eq!(a.env, [("A".to_string(), "b=c".to_string())]);
}

#[test]
fn sizes_and_env_are_checked() {
    assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
    assert_eq!(parse_bytes("100").unwrap(), 100);
    assert!(
        parse_bytes("lots")
            .unwrap_err()
            .to_string()
            .contains("not a size")
    );
    assert!(parse_env("NOEQUALS").is_err());
}

#[test]
fn grpc_errors_become_sentences() {
    let e = explain(
        tonic::Status::unavailable("connection refused"),
        "10.0.0.1:7070",
    );
    assert!(
        e.to_string()
            .starts_with("cannot reach the coordinator at 10.0.0.1:7070")
    );
    let e = explain(
        tonic::Status::not_found("no job j9: `govctl jobs --all` lists the known jobs"),
        "x",
    );
    assert_eq!(
        e.to_string(),
        "no job j9: `govctl jobs --all` lists the known jobs"
    );
}
