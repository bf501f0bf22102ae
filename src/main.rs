fn main() -> std::process::ExitCode {
    migdra::cli::main()
}
