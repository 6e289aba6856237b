use super::*;

fn run(matcher: &mut StopMatcher, pieces: &[&str]) -> (String, Option<String>) {
    let mut out = String::new();
    for piece in pieces {
        let step = matcher.push(piece);
        out.push_str(&step.text);
        if step.matched.is_some() {
            return (out, matcher.matched_stop().map(str::to_owned));
        }
    }
    out.push_str(&matcher.finish());
    (out, None)
}

#[test]
fn no_stops_passes_pieces_through_borrowed() {
    let mut matcher = StopMatcher::new(Vec::<String>::new(), false);
    let step = matcher.push("hello");
    assert!(matches!(step.text, Cow::Borrowed("hello")));
    assert_eq!(matcher.finish(), "");
}

#[test]
fn stop_string_in_one_piece_cuts_it_and_what_follows() {
    let mut matcher = StopMatcher::new(["STOP"], false);
    let (out, matched) = run(&mut matcher, &["Hello STOP world", " more"]);
    assert_eq!(out, "Hello ");
    assert_eq!(matched.as_deref(), Some("STOP"));
}

#[test]
fn stop_string_split_across_pieces_is_never_sent() {
    let mut matcher = StopMatcher::new(["</answer>"], false);
    let mut sent = Vec::new();
    for piece in ["The answer is 4", "</", "ans", "wer", ">trailing"] {
        let step = matcher.push(piece);
        sent.push(step.text.into_owned());
        if step.matched.is_some() {
            break;
        }
    }
    assert_eq!(sent, ["The answer is 4", "", "", "", ""]);
    assert_eq!(matcher.matched_stop(), Some("</answer>"));
}

#[test]
fn held_text_is_released_when_the_candidate_fails() {
    let mut matcher = StopMatcher::new(["\n\nUser:"], false);
    let a = matcher.push("one\n").text.into_owned();
    let b = matcher.push("\nUs").text.into_owned();
    let c = matcher.push("ually fine").text.into_owned();
    assert_eq!((a.as_str(), b.as_str()), ("one", ""));
    assert_eq!(c, "\n\nUsually fine");
    assert!(!matcher.is_stopped());
}

#[test]
fn held_text_is_released_at_end_of_stream() {
    let mut matcher = StopMatcher::new(["<|end|>"], false);
    let (out, matched) = run(&mut matcher, &["partial <|e", "n"]);
    assert_eq!(out, "partial <|en");
    assert_eq!(matched, None);
}

#[test]
fn include_stop_str_in_output_keeps_the_stop_but_not_the_rest() {
    let mut matcher = StopMatcher::new(["END"], true);
    let (out, matched) = run(&mut matcher, &["abc E", "ND tail"]);
    assert_eq!(out, "abc END");
    assert_eq!(matched.as_deref(), Some("END"));
}

#[test]
fn overlapping_candidates_pick_the_first_to_complete() {
    // "bc" completes before "abcd" could.
    let mut matcher = StopMatcher::new(["abcd", "bc"], false);
    let (out, matched) = run(&mut matcher, &["xa", "b", "cd"]);
    assert_eq!(out, "xa");
    assert_eq!(matched.as_deref(), Some("bc"));

    // Same answer whatever the split.
    let mut matcher = StopMatcher::new(["abcd", "bc"], false);
    assert_eq!(run(&mut matcher, &["xabcd"]).0, "xa");

    // Same end: the longer (earlier starting) one wins.
    let mut matcher = StopMatcher::new(["c", "abc"], false);
    let (out, matched) = run(&mut matcher, &["zab", "c"]);
    assert_eq!(out, "z");
    assert_eq!(matched.as_deref(), Some("abc"));
}

#[test]
fn a_stop_that_is_a_prefix_of_another_matches_when_complete() {
    let mut matcher = StopMatcher::new(["ab", "abc"], false);
    let (out, matched) = run(&mut matcher, &["1a", "b", "c"]);
    assert_eq!(out, "1");
    assert_eq!(matched.as_deref(), Some("ab"));
}

#[test]
fn repeated_prefix_characters_hold_only_the_needed_suffix() {
    let mut matcher = StopMatcher::new(["aab"], false);
    assert_eq!(matcher.push("xaaaa").text, "xaa");
    assert_eq!(matcher.push("a").text, "a");
    let step = matcher.push("b!");
    assert_eq!(step.text, "");
    assert_eq!(step.matched, Some(0));
}

#[test]
fn multibyte_stop_strings_are_matched_on_char_boundaries() {
    let mut matcher = StopMatcher::new(["世界", "🙂!"], false);
    let (out, matched) = run(&mut matcher, &["你好", "世", "界"]);
    assert_eq!(out, "你好");
    assert_eq!(matched.as_deref(), Some("世界"));

    let mut matcher = StopMatcher::new(["🙂!"], false);
    let (out, matched) = run(&mut matcher, &["ok 🙂", "?"]);
    assert_eq!(out, "ok 🙂?");
    assert_eq!(matched, None);
}

#[test]
fn nothing_is_emitted_after_a_match_and_empty_stops_are_ignored() {
    let mut matcher = StopMatcher::new(["", "x"], false);
    assert_eq!(matcher.stops().len(), 1);
    assert_eq!(matcher.push("axb").text, "a");
    assert_eq!(matcher.push("more").text, "");
    assert_eq!(matcher.finish(), "");
}

#[test]
fn many_stop_strings_are_supported() {
    let stops: Vec<String> = (0..20).map(|i| format!("<stop{i}>")).collect();
    let mut matcher = StopMatcher::new(stops, false);
    let (out, matched) = run(&mut matcher, &["text <stop1", "7> after"]);
    assert_eq!(out, "text ");
    assert_eq!(matched.as_deref(), Some("<stop17>"));
}

#[test]
fn token_conditions_follow_vllm() {
    let conditions = TokenStopConditions {
        eos_token_ids: vec![2],
        stop_token_ids: vec![7],
        ignore_eos: false,
        min_tokens: 3,
        max_tokens: Some(5),
    };
    assert_eq!(conditions.check(2, 1), None, "min_tokens holds back eos");
    assert_eq!(
        conditions.check(7, 2),
        None,
        "min_tokens holds back stop tokens"
    );
    assert_eq!(conditions.check(2, 3), Some(TokenStop::Eos(2)));
    assert_eq!(conditions.check(7, 4), Some(TokenStop::StopToken(7)));
    assert_eq!(conditions.check(9, 4), None);
    assert_eq!(conditions.check(9, 5), Some(TokenStop::Length));
    assert_eq!(
        conditions.check(2, 5),
        Some(TokenStop::Eos(2)),
        "eos wins over length"
    );

    let ignoring = TokenStopConditions {
        ignore_eos: true,
        ..conditions
    };
    assert_eq!(ignoring.check(2, 4), None);
    assert_eq!(ignoring.check(7, 4), Some(TokenStop::StopToken(7)));
    assert_eq!(TokenStop::Length.finish_reason(), FinishReason::Length);
    assert_eq!(TokenStop::Eos(2).finish_reason(), FinishReason::Stop);
    assert!(!TokenStop::Eos(2).is_token_in_output(false));
    assert!(TokenStop::Eos(2).is_token_in_output(true));
}
