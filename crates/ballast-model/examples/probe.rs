fn main() {
    let path = std::env::args().nth(1).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    match ballast_model::parse_file(&path, &text) {
        Ok(o) => println!("ok: {} objects", o.len()),
        Err(es) => {
            for e in es {
                println!("{e}")
            }
        }
    }
}
