# Writes the chat page (IN) as a C array (OUT), so the binary serves it without finding files.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n_bytes "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){24})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}" "/* Generated from src/server/chat.html by src/server/embed.cmake; do not edit. */\n"
  "#include <stddef.h>\n"
  "const unsigned char server_chat_html[] = {\n${bytes}0};\n"
  "const size_t server_chat_html_len = ${n_bytes};\n")
